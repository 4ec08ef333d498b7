package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/narwhal-llm/narwhal/wire"
)

// DefaultRoutedPaths are the paths routed to the ORIGINAL_DST cluster unless
// WithRoutedPaths says otherwise (the default router.paths).
var DefaultRoutedPaths = []string{"/v1/completions", "/v1/chat/completions"}

// Route says where the gateway's router sent a request.
type Route string

// The routes.
const (
	// RouteNone: the request ended before routing (local reply, cancel).
	RouteNone Route = ""
	// RouteOriginalDst: a routed path; the upstream is the IP:port in
	// x-gateway-destination-endpoint (503 when missing or invalid).
	RouteOriginalDst Route = "original_dst"
	// RouteDefault: an unprocessed path sent to the default upstream.
	RouteDefault Route = "default"
	// RouteNotFound: an unprocessed path with no default upstream: 404.
	RouteNotFound Route = "not_found"
)

// Outcome records what the gateway did with one request.
type Outcome struct {
	Method, Path string
	// Route and Upstream: where the request went ("" when nowhere).
	Route    Route
	Upstream string
	// Destination is x-gateway-destination-endpoint as the router saw it.
	Destination string
	// Placement holds the placement headers of the request as it left the
	// filter: x-gateway-destination-endpoint, x-prefiller-host-port and
	// x-narwhal-*.
	Placement http.Header
	// Status is the status sent downstream (0 when none was).
	Status int
	// LocalReply is the filter's local reply, if any.
	LocalReply *LocalReply
	// RouterReply is set when the router answered itself: 503 (no healthy
	// upstream, connection failure) or 404 (no route).
	RouterReply bool
	// UpstreamError is the error reaching the upstream, if any.
	UpstreamError error
	// Cancelled: the downstream client went away. Reset: the gateway reset
	// the downstream stream after the response had started.
	Cancelled, Reset bool
	// Chunks and Bytes count the body writes (each flushed) downstream.
	Chunks, Bytes int
	// Record is the ext_proc exchange's record.
	Record *Record
	// Start, FirstByte (from Start to the first body chunk downstream) and
	// Duration.
	Start               time.Time
	FirstByte, Duration time.Duration
}

// GatewayOption configures a Gateway.
type GatewayOption func(*gatewayConfig)

type gatewayConfig struct {
	routed          []string
	allRouted       bool
	metadata        func(*http.Request) map[string]*structpb.Struct
	defaultUpstream string
	hook            func(Outcome)
	dialOpts        []grpc.DialOption
}

// WithRoutedPaths sets the paths routed to the ORIGINAL_DST cluster
// (exact match on the path without query). Default: DefaultRoutedPaths.
func WithRoutedPaths(paths ...string) GatewayOption {
	return func(c *gatewayConfig) { c.routed = paths }
}

// WithFilterMetadata sets each request's filter metadata, as filters before ext_proc would
// (a GIE gateway's subset hint, say); Mode.ForwardingNamespaces says which namespaces reach the
// ext_proc server.
func WithFilterMetadata(f func(*http.Request) map[string]*structpb.Struct) GatewayOption {
	return func(c *gatewayConfig) { c.metadata = f }
}

// WithAllPathsRouted routes every path to the ORIGINAL_DST cluster, as a Gateway API Inference
// Extension gateway does (an HTTPRoute whose backend is an InferencePool: every request goes
// through the endpoint picker, and to the endpoint it names).
func WithAllPathsRouted() GatewayOption {
	return func(c *gatewayConfig) { c.allRouted = true }
}

// WithDefaultUpstream sends every other path to hostport; without it they
// get 404, as with no matching route.
func WithDefaultUpstream(hostport string) GatewayOption {
	return func(c *gatewayConfig) { c.defaultUpstream = hostport }
}

// WithOutcomeHook calls f with every request's outcome when it ends.
func WithOutcomeHook(f func(Outcome)) GatewayOption {
	return func(c *gatewayConfig) { c.hook = f }
}

// WithDialOptions adds options to the ext_proc connection.
func WithDialOptions(opts ...grpc.DialOption) GatewayOption {
	return func(c *gatewayConfig) { c.dialOpts = append(c.dialOpts, opts...) }
}

// Gateway plays Envoy in front of engines: an http.Handler that runs each
// request through the ext_proc server, routes it as an ORIGINAL_DST cluster
// with use_http_header does, and streams the response back through the
// response phases, flushing every chunk.
type Gateway struct {
	conn      *grpc.ClientConn
	client    *Client
	transport *http.Transport
	routed    map[string]bool
	allRouted bool // every path to ORIGINAL_DST (WithAllPathsRouted)
	metadata  func(*http.Request) map[string]*structpb.Struct
	upstream  string
	hook      func(Outcome)

	mu       sync.Mutex
	outcomes []Outcome
	changed  chan struct{}
}

// NewGateway dials the ext_proc server at extprocAddr (HTTP/2, one
// connection, as Envoy's ext_proc cluster) and returns a gateway playing
// the filter with mode. Close it when done.
func NewGateway(extprocAddr string, mode Mode, opts ...GatewayOption) (*Gateway, error) {
	cfg := gatewayConfig{routed: DefaultRoutedPaths}
	for _, o := range opts {
		o(&cfg)
	}
	conn, err := Dial(extprocAddr, cfg.dialOpts...)
	if err != nil {
		return nil, err
	}
	client, err := NewClient(conn, mode)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	g := &Gateway{
		conn:   conn,
		client: client,
		transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
		routed:    map[string]bool{},
		upstream:  cfg.defaultUpstream,
		allRouted: cfg.allRouted,
		metadata:  cfg.metadata,
		hook:      cfg.hook,
		changed:   make(chan struct{}),
	}
	for _, p := range cfg.routed {
		g.routed[p] = true
	}
	return g, nil
}

// Client returns the ext_proc client the gateway uses.
func (g *Gateway) Client() *Client { return g.client }

// Close closes the ext_proc connection and idle upstream connections.
func (g *Gateway) Close() error {
	g.transport.CloseIdleConnections()
	return g.conn.Close()
}

// Outcomes returns the outcomes of the requests that have ended, in order.
func (g *Gateway) Outcomes() []Outcome {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]Outcome(nil), g.outcomes...)
}

// WaitOutcomes waits until at least n requests have ended (a handler ends a
// little after the client has read the response) and returns the outcomes.
func (g *Gateway) WaitOutcomes(ctx context.Context, n int) ([]Outcome, error) {
	for {
		g.mu.Lock()
		if len(g.outcomes) >= n {
			out := append([]Outcome(nil), g.outcomes...)
			g.mu.Unlock()
			return out, nil
		}
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return g.Outcomes(), ctx.Err()
		}
	}
}

func (g *Gateway) record(oc Outcome) {
	g.mu.Lock()
	g.outcomes = append(g.outcomes, oc)
	close(g.changed)
	g.changed = make(chan struct{})
	g.mu.Unlock()
	if g.hook != nil {
		g.hook(oc)
	}
}

// ServeHTTP handles one request as Envoy would.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	oc := &Outcome{Method: r.Method, Path: r.URL.Path, Start: time.Now()}
	x := g.client.NewExchange(ctx)
	defer func() {
		x.Close()
		oc.Record = x.Record()
		oc.Duration = time.Since(oc.Start)
		oc.Cancelled = ctx.Err() != nil
		g.record(*oc)
	}()
	out := &httpWriter{w: w, rc: http.NewResponseController(w), oc: oc}

	orig := NewRequestHeaders(r.Method, r.URL.RequestURI(), r.Host, r.Header)
	var body io.Reader
	if r.ContentLength != 0 {
		body = r.Body
	}
	var md map[string]*structpb.Struct
	if g.metadata != nil {
		md = g.metadata(r)
	}
	res, err := x.ProcessRequest(Request{Headers: orig, Body: body, FilterMetadata: md})
	if err != nil {
		return
	}
	if lr := res.LocalReply; lr != nil {
		oc.LocalReply = lr
		_ = out.writeLocal(lr)
		return
	}
	oc.Placement = placement(res.Headers)

	// Envoy chose the route from the original headers unless the route
	// cache was cleared; ORIGINAL_DST reads its header from the final ones.
	routeBy := orig
	if res.RouteCacheCleared {
		routeBy = res.Headers
	}
	resp, closeBody := g.route(ctx, oc, routeBy, res)
	defer closeBody()
	if resp == nil {
		return
	}
	err = x.ProcessResponse(*resp, out)
	if lr := x.Record().LocalReply; lr != nil {
		oc.LocalReply = lr
	}
	if err != nil && (errors.Is(err, ErrStreamReset) || ctx.Err() == nil) {
		// The response broke (a local reply after it started, or the
		// upstream reset): Envoy resets the downstream stream.
		oc.Reset = true
		closeBody()
		panic(http.ErrAbortHandler)
	}
}

// route picks the upstream, forwards the request, and returns the response
// to run through the response phases (the router's own reply when there is
// no upstream), or nil when the client went away.
func (g *Gateway) route(ctx context.Context, oc *Outcome, routeBy Headers, res *RequestResult) (*Response, func()) {
	noop := func() {}
	path := routeBy.Get(":path")
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	switch {
	case g.allRouted || g.routed[path]:
		oc.Route = RouteOriginalDst
		oc.Destination = res.Headers.Get(wire.HeaderDestination)
		ap, err := netip.ParseAddrPort(oc.Destination)
		if err != nil {
			return routerReply(oc, 503, "no healthy upstream"), noop
		}
		oc.Upstream = ap.String()
	case g.upstream != "":
		oc.Route, oc.Upstream = RouteDefault, g.upstream
	default:
		oc.Route = RouteNotFound
		return routerReply(oc, 404, ""), noop
	}
	up, err := g.forward(ctx, res.Headers, res.Body, oc.Upstream)
	if err != nil {
		if ctx.Err() != nil {
			return nil, noop
		}
		oc.UpstreamError = err
		return routerReply(oc, 503, "upstream connect error or disconnect/reset before headers. reset reason: connection failure"), noop
	}
	var once sync.Once
	closeBody := func() { once.Do(func() { _ = up.Body.Close() }) }
	resp := &Response{Headers: NewResponseHeaders(up.StatusCode, up.Header)}
	if up.ContentLength != 0 && up.Body != http.NoBody {
		resp.Body = up.Body
	}
	return resp, closeBody
}

// forward sends the request as it left the filter to hostport over the
// pooled keep-alive transport.
func (g *Gateway) forward(ctx context.Context, h Headers, body []byte, hostport string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, h.Get(":method"), "http://"+hostport+h.Get(":path"), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Host = h.Get(":authority")
	for _, f := range h {
		if strings.HasPrefix(f.Key, ":") || hopByHop[f.Key] || f.Key == "content-length" || f.Key == "host" {
			continue
		}
		req.Header.Add(f.Key, f.Value)
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""} // Go adds its own otherwise
	}
	return g.transport.RoundTrip(req)
}

// routerReply is a reply Envoy's router generates; it goes through the
// filter's encode path like an upstream response.
func routerReply(oc *Outcome, status int, body string) *Response {
	oc.RouterReply = true
	hdr := http.Header{}
	var r io.Reader
	if body != "" {
		hdr.Set("Content-Type", "text/plain")
		hdr.Set("Content-Length", strconv.Itoa(len(body)))
		r = strings.NewReader(body)
	}
	return &Response{Headers: NewResponseHeaders(status, hdr), Body: r}
}

// placement extracts the headers Narwhal places requests with.
func placement(h Headers) http.Header {
	out := http.Header{}
	for _, f := range h {
		if f.Key == wire.HeaderDestination || f.Key == wire.HeaderPrefiller || strings.HasPrefix(f.Key, wire.HeaderPrefix) {
			out.Add(f.Key, f.Value)
		}
	}
	return out
}

// httpWriter writes a response downstream, flushing every chunk.
type httpWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	oc *Outcome
}

var _ ResponseWriter = (*httpWriter)(nil)

// WriteHeaders implements ResponseWriter.
func (h *httpWriter) WriteHeaders(hd Headers) error {
	dst := h.w.Header()
	for _, f := range hd {
		if strings.HasPrefix(f.Key, ":") || hopByHop[f.Key] {
			continue
		}
		dst.Add(f.Key, f.Value)
	}
	status := hd.Status()
	if status == 0 {
		status = http.StatusBadGateway
	}
	h.oc.Status = status
	h.w.WriteHeader(status)
	return h.rc.Flush()
}

// WriteBody implements ResponseWriter.
func (h *httpWriter) WriteBody(p []byte) error {
	if _, err := h.w.Write(p); err != nil {
		return err
	}
	if h.oc.Chunks == 0 {
		h.oc.FirstByte = time.Since(h.oc.Start)
	}
	h.oc.Chunks++
	h.oc.Bytes += len(p)
	return h.rc.Flush()
}

func (h *httpWriter) writeLocal(lr *LocalReply) error {
	hd := append(Headers{{Key: ":status", Value: strconv.Itoa(lr.Status)}}, lr.Headers...)
	if err := h.WriteHeaders(hd); err != nil {
		return err
	}
	if len(lr.Body) == 0 {
		return nil
	}
	return h.WriteBody(lr.Body)
}
