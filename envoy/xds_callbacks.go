package envoy

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/narwhal-llm/narwhal/tlsfiles"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
)

// callbacks hold the protocol bookkeeping of the streams: clients, pushes, NACKs, and, per
// stream and type, the last response sent, which is what stops NACK loops.
//
// A state-of-the-world NACK carries the last version the client accepted ("" if none) and
// the nonce of the response it rejects. Handed to the cache as is, that request looks like a
// client behind the current version, and the cache answers it at once with the same
// resources, which the client rejects again: a resend storm. So a NACK of the last response
// sent on the stream is handed on as if it named the rejected version: the cache then waits
// for the next version before it answers that stream again. (Delta streams do not loop: the
// delta server records what it sent, and a NACK does not ask for anything new.)
type callbacks struct {
	log      *slog.Logger
	metrics  *xdsMetrics
	classify func(typeURL string) string

	clients atomic.Int64
	pushes  atomic.Uint64
	nacks   atomic.Uint64

	mu    sync.Mutex
	sotw  map[int64]*streamState // the sotw and delta servers number their streams separately
	delta map[int64]*streamState

	access  access
	refused atomic.Uint64
	logged  tlsfiles.Refusals // the refusals logged, once each
}

// access is who may open ADS streams: nil sets allow anyone.
type access struct {
	nodes      map[string]bool // node ids (xds.nodes)
	identities map[string]bool // client-certificate names (xds.identities)
}

type streamState struct {
	node    string
	checked string                  // the node id checked against access.nodes ("" before)
	sent    map[string]sentResponse // the last response sent, by type URL
}

type sentResponse struct{ nonce, version string }

var _ serverv3.Callbacks = (*callbacks)(nil)

func newCallbacks(log *slog.Logger, m *xdsMetrics, classify func(string) string) *callbacks {
	return &callbacks{log: log, metrics: m, classify: classify,
		sotw: map[int64]*streamState{}, delta: map[int64]*streamState{}}
}

// refuse counts a refused stream, logs it the first time for this who and why, and returns the
// error the client gets: PERMISSION_DENIED, before any resource is sent.
func (c *callbacks) refuse(who, why string, attrs ...any) error {
	c.refused.Add(1)
	c.metrics.refused.Inc()
	first, full := c.logged.Note(who, why)
	switch {
	case first:
		c.log.Warn("xds: stream refused: this client gets no resources (logged once)", append([]any{"client", who, "why", why}, attrs...)...)
	case full:
		c.log.Warn("xds: more distinct clients refused than are logged one by one: further ones are only counted (narwhal_xds_refused_total)", "logged", tlsfiles.MaxLoggedRefusals)
	}
	return status.Errorf(codes.PermissionDenied, "narwhal: client %q %s", who, why)
}

// checkPeer refuses a stream whose client certificate names no allowed identity.
func (c *callbacks) checkPeer(ctx context.Context) error {
	if c.access.identities == nil {
		return nil
	}
	p, _ := peer.FromContext(ctx)
	var ids []string
	if p != nil {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
			if tlsfiles.Allowed(ti.State.PeerCertificates, c.access.identities) {
				return nil
			}
			ids = tlsfiles.Identities(ti.State.PeerCertificates[0])
		}
	}
	who, addr := strings.Join(ids, ","), ""
	if who == "" {
		who = "(no client certificate)"
	}
	if p != nil {
		addr = p.Addr.String()
	}
	return c.refuse(who, "has no client certificate identity in xds.identities", "peer", addr)
}

// checkNode refuses a stream whose node id is not allowed (Envoy names its node on the first
// request only), and one that names another node later on.
func (c *callbacks) checkNode(st *streamState) error {
	if c.access.nodes == nil {
		return nil
	}
	c.mu.Lock()
	checked, node := st.checked, st.node
	if checked == "" {
		st.checked = node
	}
	c.mu.Unlock()
	switch {
	case checked != "" && node != checked:
		return c.refuse(node, "changed its node id on the stream (from "+checked+")")
	case checked != "":
		return nil
	case !c.access.nodes[node]:
		return c.refuse(node, "is not in xds.nodes")
	}
	return nil
}

func (c *callbacks) open(streams map[int64]*streamState, id int64) {
	c.mu.Lock()
	streams[id] = &streamState{sent: map[string]sentResponse{}}
	c.mu.Unlock()
	c.clients.Add(1)
	c.metrics.clients.Inc()
}

func (c *callbacks) close(streams map[int64]*streamState, id int64) {
	c.mu.Lock()
	_, ok := streams[id]
	delete(streams, id)
	c.mu.Unlock()
	if ok {
		c.clients.Add(-1)
		c.metrics.clients.Dec()
	}
}

// request records the stream's node and returns its state with the last response sent for
// typeURL (ok false when none was).
func (c *callbacks) request(streams map[int64]*streamState, id int64, node *corev3.Node, typeURL string) (st *streamState, last sentResponse, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st = streams[id]
	if st == nil { // not opened through the callbacks: cannot happen with go-control-plane
		st = &streamState{sent: map[string]sentResponse{}}
		streams[id] = st
	}
	if node.GetId() != "" {
		st.node = node.GetId()
	}
	last, ok = st.sent[typeURL]
	return st, last, ok
}

func (c *callbacks) nack(id int64, node, typeURL, nonce, rejected string, detail string, delta bool) {
	c.nacks.Add(1)
	c.metrics.nacks.WithLabelValues(typeLabel(typeURL)).Inc()
	c.log.Warn("xds: client rejected a response", "stream", id, "delta", delta, "node", node,
		"type", typeLabel(typeURL), "nonce", nonce, "version", rejected, "error", detail)
}

func (c *callbacks) pushed(typeURL string) {
	c.pushes.Add(1)
	c.metrics.pushes.WithLabelValues(typeLabel(typeURL)).Inc()
}

// OnStreamOpen counts a state-of-the-world stream.
func (c *callbacks) OnStreamOpen(ctx context.Context, id int64, _ string) error {
	if err := c.checkPeer(ctx); err != nil {
		return err
	}
	c.open(c.sotw, id)
	return nil
}

// OnStreamClosed forgets a state-of-the-world stream.
func (c *callbacks) OnStreamClosed(id int64, _ *corev3.Node) { c.close(c.sotw, id) }

// OnDeltaStreamOpen counts a delta stream.
func (c *callbacks) OnDeltaStreamOpen(ctx context.Context, id int64, _ string) error {
	if err := c.checkPeer(ctx); err != nil {
		return err
	}
	c.open(c.delta, id)
	return nil
}

// OnDeltaStreamClosed forgets a delta stream.
func (c *callbacks) OnDeltaStreamClosed(id int64, _ *corev3.Node) { c.close(c.delta, id) }

// OnStreamRequest counts and logs NACKs, and turns the NACK of the last response into a
// request at the rejected version (see callbacks).
func (c *callbacks) OnStreamRequest(id int64, req *discovery.DiscoveryRequest) error {
	typeURL := req.GetTypeUrl()
	st, last, ok := c.request(c.sotw, id, req.GetNode(), typeURL)
	if err := c.checkNode(st); err != nil {
		return err
	}
	if c.classify(typeURL) == unservedKey && !ok && req.GetResponseNonce() == "" {
		c.log.Info("xds: request for a type Narwhal does not serve, left unanswered", "stream", id, "node", st.node, "type", typeURL)
	}
	if req.GetErrorDetail() == nil {
		return nil
	}
	rejected := ""
	if ok && last.nonce == req.GetResponseNonce() {
		rejected = last.version
		req.VersionInfo = last.version
	}
	c.nack(id, st.node, typeURL, req.GetResponseNonce(), rejected, req.GetErrorDetail().GetMessage(), false)
	return nil
}

// OnStreamResponse records the response about to be sent on a state-of-the-world stream.
func (c *callbacks) OnStreamResponse(_ context.Context, id int64, _ *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
	c.mu.Lock()
	if st := c.sotw[id]; st != nil {
		st.sent[resp.GetTypeUrl()] = sentResponse{nonce: resp.GetNonce(), version: resp.GetVersionInfo()}
	}
	c.mu.Unlock()
	c.pushed(resp.GetTypeUrl())
}

// OnStreamDeltaRequest counts and logs NACKs on delta streams.
func (c *callbacks) OnStreamDeltaRequest(id int64, req *discovery.DeltaDiscoveryRequest) error {
	st, last, ok := c.request(c.delta, id, req.GetNode(), req.GetTypeUrl())
	if err := c.checkNode(st); err != nil {
		return err
	}
	if req.GetErrorDetail() != nil {
		rejected := ""
		if ok && last.nonce == req.GetResponseNonce() {
			rejected = last.version
		}
		c.nack(id, st.node, req.GetTypeUrl(), req.GetResponseNonce(), rejected, req.GetErrorDetail().GetMessage(), true)
	}
	return nil
}

// OnStreamDeltaResponse records and counts a delta response.
func (c *callbacks) OnStreamDeltaResponse(id int64, _ *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
	c.mu.Lock()
	if st := c.delta[id]; st != nil {
		st.sent[resp.GetTypeUrl()] = sentResponse{nonce: resp.GetNonce(), version: resp.GetSystemVersionInfo()}
	}
	c.mu.Unlock()
	c.pushed(resp.GetTypeUrl())
}

// OnFetchRequest and OnFetchResponse belong to REST xDS, which Narwhal does not serve.
func (c *callbacks) OnFetchRequest(context.Context, *discovery.DiscoveryRequest) error { return nil }

// OnFetchResponse: see OnFetchRequest.
func (c *callbacks) OnFetchResponse(*discovery.DiscoveryRequest, *discovery.DiscoveryResponse) {}

// typeLabel is the short name of a type URL in metrics and logs.
func typeLabel(typeURL string) string {
	switch typeURL {
	case resource.ClusterType:
		return "cds"
	case resource.EndpointType:
		return "eds"
	case resource.ListenerType:
		return "lds"
	case resource.RouteType:
		return "rds"
	}
	return "other"
}

type xdsMetrics struct {
	clients prometheus.Gauge
	pushes  *prometheus.CounterVec
	nacks   *prometheus.CounterVec
	version prometheus.Gauge
	refused prometheus.Counter
}

func newXDSMetrics(reg prometheus.Registerer) *xdsMetrics {
	m := &xdsMetrics{
		clients: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "narwhal_xds_clients", Help: "ADS streams open (state of the world and delta).",
		}),
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narwhal_xds_pushes_total", Help: "xDS responses sent, by type (cds, eds, ...).",
		}, []string{"type"}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narwhal_xds_nacks_total", Help: "xDS responses clients rejected, by type (cds, eds, ...).",
		}, []string{"type"}),
		version: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "narwhal_xds_version", Help: "The fleet version the published xDS resources reflect.",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "narwhal_xds_refused_total", Help: "ADS streams refused: a node id not in xds.nodes, or a client certificate with no identity in xds.identities.",
		}),
	}
	for _, t := range []string{"cds", "eds"} {
		m.pushes.WithLabelValues(t)
		m.nacks.WithLabelValues(t)
	}
	if reg != nil {
		reg.MustRegister(m.clients, m.pushes, m.nacks, m.version, m.refused)
	}
	return m
}
