package envoy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/sotw/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/wire"
)

// Version prefixes of the two resource types; each type counts its own versions, so a new EDS
// version leaves CDS alone.
const (
	cdsVersionPrefix = "cds-"
	edsVersionPrefix = "eds-"
)

// Server is Narwhal's xDS server: ADS over gRPC, state of the world and delta, serving the
// fleet's three EDS clusters (CDS) and their assignments (EDS) to any node. It decides nothing:
// it translates fleet snapshots and publishes them.
//
// Each resource type lives in its own go-control-plane LinearCache (under a MuxCache), which
// versions the type on its own, marshals each resource once for every stream, and remembers
// per stream which resource versions were sent. Every node sees the same caches.
type Server struct {
	names wire.ClusterNames
	fleet *fleet.Fleet
	log   *slog.Logger

	cds, eds *cache.LinearCache
	mux      *cache.MuxCache
	xds      serverv3.Server
	cb       *callbacks
	metrics  *xdsMetrics

	mu      sync.Mutex // serializes publish
	enc     *encoder
	last    [3][]member
	edsSeq  uint64 // the EDS cache's version counter (one UpdateResources, one version)
	skipped []Skipped
	state   atomic.Pointer[published]
}

// published is what clients are being served.
type published struct {
	fleetVersion uint64
	version      string // EDS
	skipped      []Skipped
}

// Stats is the xDS server's state for /narwhal/state.
type Stats struct {
	Clients      int       `json:"clients"`           // ADS streams open (state of the world and delta)
	Pushes       uint64    `json:"pushes"`            // responses sent, every type
	Nacks        uint64    `json:"nacks"`             // requests that rejected a response
	Version      string    `json:"version"`           // the EDS version published (what clients ACK)
	FleetVersion uint64    `json:"fleet_version"`     // the fleet version the published resources reflect
	Skipped      []Skipped `json:"skipped,omitempty"` // engines not in any assignment, and why
	Refused      uint64    `json:"refused"`           // streams refused by xds.nodes or xds.identities
}

// NewServer builds the xDS server of prefix (config xds.cluster_prefix) and publishes the
// fleet's current state. Its ADS streams live until ctx ends (then every open stream ends, so
// that the gRPC server can stop). Metrics (narwhal_xds_clients, narwhal_xds_pushes_total{type},
// narwhal_xds_nacks_total{type}, narwhal_xds_version) are registered with reg unless it is nil.
func NewServer(ctx context.Context, prefix string, f *fleet.Fleet, log *slog.Logger, reg prometheus.Registerer) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cpLog := cpLogger{log.With("component", "xds")}
	s := &Server{
		names:   wire.Names(prefix),
		fleet:   f,
		log:     log,
		cds:     cache.NewLinearCache(resource.ClusterType, cache.WithVersionPrefix(cdsVersionPrefix), cache.WithLogger(cpLog)),
		eds:     cache.NewLinearCache(resource.EndpointType, cache.WithVersionPrefix(edsVersionPrefix), cache.WithLogger(cpLog)),
		metrics: newXDSMetrics(reg),
		enc:     newEncoder(),
	}
	s.mux = &cache.MuxCache{Caches: map[string]cache.Cache{
		resource.ClusterType:  s.cds,
		resource.EndpointType: s.eds,
		unservedKey:           unserved{},
	}}
	s.mux.Classify = func(r *cache.Request) string { return s.classify(r.GetTypeUrl()) }
	s.mux.ClassifyDelta = func(r *cache.DeltaRequest) string { return s.classify(r.GetTypeUrl()) }
	s.cb = newCallbacks(log, s.metrics, s.classify)
	s.xds = serverv3.NewServer(ctx, s.mux, s.cb, sotw.WithLogger(cpLog))

	// The clusters depend on the prefix alone: one CDS version for the server's life.
	clusters := map[string]types.Resource{}
	for _, c := range Clusters(prefix) {
		clusters[c.GetName()] = c
	}
	if err := s.cds.UpdateResources(clusters, nil); err != nil {
		log.Error("xds: publish clusters", "err", err)
	}
	snap := f.Snapshot()
	s.publish(&snap)
	return s
}

// Restrict limits who gets resources (docs/security.md): with nodes, only streams whose Envoy
// names one of these node ids; with identities, only streams over mutual TLS whose client
// certificate names one of them (a URI SAN, a DNS SAN or the common name). Anyone else's stream
// ends with PERMISSION_DENIED before any resource is sent, and is logged once. Empty lists allow
// every client. Call it before the server serves.
func (s *Server) Restrict(nodes, identities []string) {
	set := func(l []string) map[string]bool {
		if len(l) == 0 {
			return nil
		}
		m := make(map[string]bool, len(l))
		for _, x := range l {
			m[x] = true
		}
		return m
	}
	s.cb.access = access{nodes: set(nodes), identities: set(identities)}
}

// unservedKey classifies requests for types Narwhal does not serve.
const unservedKey = ""

func (s *Server) classify(typeURL string) string {
	if _, ok := s.mux.Caches[typeURL]; ok && typeURL != unservedKey {
		return typeURL
	}
	return unservedKey
}

// ServerOptions are the gRPC server options for the xDS listener (listen.xds): a ping to a
// connection idle for 30 s, closed if unanswered within 10 s, so that a proxy that vanished
// without closing its connection stops counting as a client (the default waits 2 h).
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	}
}

// Register adds the ADS service (state of the world and delta) to g.
func (s *Server) Register(g grpc.ServiceRegistrar) {
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(g, s.xds)
}

// Run follows the fleet, publishing a new EDS version after every change that changes an
// assignment, until ctx ends; it returns ctx's error.
func (s *Server) Run(ctx context.Context) error {
	ch, cancel := s.fleet.Subscribe()
	defer cancel()
	for {
		snap := s.fleet.Snapshot()
		s.publish(&snap)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// publish translates one fleet snapshot and updates the assignments that changed, all in one
// EDS version; a snapshot that changes no assignment (an undrain that leaves the engine
// draining, say) publishes nothing.
func (s *Server) publish(snap *fleet.Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, skipped := fleetMembers(snap.Engines)
	next := splitMembers(m)
	diff := changedClusters(s.last, next)
	if s.edsSeq == 0 {
		diff = [3]bool{true, true, true} // the first publish
	}
	if !slices.Equal(skipped, s.skipped) {
		for _, sk := range skipped {
			s.log.Warn("xds: engine left out of EDS", "engine", sk.Engine, "address", sk.Addr, "reason", sk.Reason)
		}
		s.skipped = skipped
	}
	var update map[string]types.Resource
	if diff != [3]bool{} {
		update = make(map[string]types.Resource, 3)
		for _, cla := range s.enc.assignments(s.names, m, diff) {
			update[cla.GetClusterName()] = cla
		}
		s.edsSeq++ // the EDS cache's next version: one per UpdateResources
		s.last = next
	}
	// Stats report the version before any client can receive it.
	p := &published{fleetVersion: snap.Version, version: edsVersionPrefix + strconv.FormatUint(s.edsSeq, 10), skipped: skipped}
	s.state.Store(p)
	s.metrics.version.Set(float64(snap.Version))
	if update != nil {
		s.log.Debug("xds: publish", "fleet_version", p.fleetVersion, "eds_version", p.version, "assignments", len(update))
		if err := s.eds.UpdateResources(update, nil); err != nil {
			// Only when the cache cannot marshal a resource to hash it for a delta
			// client: the resources are stored and versioned all the same.
			s.log.Error("xds: publish endpoints", "fleet_version", snap.Version, "err", err)
		}
	}
}

// Stats reports clients, pushes, NACKs and the published version.
func (s *Server) Stats() Stats {
	p := s.state.Load()
	return Stats{
		Clients:      int(s.cb.clients.Load()),
		Pushes:       s.cb.pushes.Load(),
		Nacks:        s.cb.nacks.Load(),
		Version:      p.version,
		FleetVersion: p.fleetVersion,
		Skipped:      slices.Clone(p.skipped),
		Refused:      s.cb.refused.Load(),
	}
}

// unserved never answers: a request for a type Narwhal does not serve (LDS, say) stays
// pending instead of closing the whole ADS stream (which a MuxCache without a match does).
type unserved struct{}

var _ cache.Cache = unserved{}

func (unserved) CreateWatch(*cache.Request, cache.Subscription, chan cache.Response) (func(), error) {
	return func() {}, nil
}

func (unserved) CreateDeltaWatch(*cache.DeltaRequest, cache.Subscription, chan cache.DeltaResponse) (func(), error) {
	return func() {}, nil
}

func (unserved) Fetch(context.Context, *cache.Request) (cache.Response, error) {
	return nil, errors.New("xds: type not served")
}

// cpLogger adapts go-control-plane's logger to slog. go-control-plane logs every watch at
// info: its info goes to debug.
type cpLogger struct{ l *slog.Logger }

func (c cpLogger) Debugf(format string, args ...any) { c.logf(slog.LevelDebug, format, args) }
func (c cpLogger) Infof(format string, args ...any)  { c.logf(slog.LevelDebug, format, args) }
func (c cpLogger) Warnf(format string, args ...any)  { c.logf(slog.LevelWarn, format, args) }
func (c cpLogger) Errorf(format string, args ...any) { c.logf(slog.LevelError, format, args) }

func (c cpLogger) logf(level slog.Level, format string, args []any) {
	if ctx := context.Background(); c.l.Enabled(ctx, level) {
		c.l.Log(ctx, level, fmt.Sprintf(format, args...))
	}
}
