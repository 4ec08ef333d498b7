package extproc_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/extproc"
	"github.com/narwhal-llm/narwhal/extproc/envoytest"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/gateway"
	"github.com/narwhal-llm/narwhal/router"
	"github.com/narwhal-llm/narwhal/wire"
)

// harness is the real ext_proc server over gRPC with a real router and fleet, and no engines:
// the test plays Envoy and, through the response phases, the engines. Engine addresses are IP
// addresses nothing listens on. Passive-health ejections mark the engine failed in the fleet,
// as narwhal serve does.
type harness struct {
	t      testing.TB
	cfg    *config.Config
	fleet  *fleet.Fleet
	live   *router.Live
	sizer  *extproc.Sizer
	srv    *extproc.Server
	addr   string
	conn   *grpc.ClientConn
	client *gateway.Client
}

func newHarness(t testing.TB, mode gateway.Mode, tweak func(*config.Config), roles ...string) *harness {
	t.Helper()
	if len(roles) == 0 {
		roles = []string{"prefill", "prefill", "decode", "decode"}
	}
	cfg := config.Default()
	cfg.Router.LocalPrefill = config.LocalPrefillOff // the disaggregated wire; TestLocalPrefill has the local one
	cfg.Profiles = map[string]config.Profile{"fast": fastProfile()}
	for i, role := range roles {
		cfg.Engines = append(cfg.Engines, config.Engine{ID: fmt.Sprintf("e%d", i+1), Address: fmt.Sprintf("10.9.0.%d:8000", i+1), Role: role, Profile: "fast"})
	}
	h := &harness{t: t, cfg: cfg}
	h.fleet, h.live = startRouter(t, cfg, tweak)
	var err error
	if h.sizer, err = extproc.NewSizer(cfg.Router.Sizing); err != nil {
		t.Fatal(err)
	}
	h.srv = extproc.NewServer(extproc.Options{Router: cfg.Router, Placer: h.live, Sizer: h.sizer, StreamLimit: extproc.StreamLimit(cfg, h.fleet.Snapshot().Engines)})
	h.addr = envoytest.StartServer(t, h.srv, extproc.GRPCServerOptions(cfg)...)
	h.conn, err = grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.conn.Close() })
	h.client = envoytest.NewTestClient(t, h.addr, mode)
	return h
}

// startRouter applies tweak to cfg, validates it, and runs its fleet and a live router until
// the test ends. Passive-health ejections mark the engine failed, as narwhal serve does.
func startRouter(t testing.TB, cfg *config.Config, tweak func(*config.Config)) (*fleet.Fleet, *router.Live) {
	t.Helper()
	if tweak != nil {
		tweak(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	f, err := fleet.New(cfg, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	live := router.NewLive(router.New(cfg, f.Snapshot(), time.Now()), time.Now, router.Hooks{
		Eject: func(e router.Ejection) { _, _ = f.SetLifecycle(e.Engine, fleet.Failed, time.Now(), "passive") },
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = live.Run(ctx) })
	wg.Go(func() { live.Follow(ctx, f) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return f, live
}

// idle waits until the server has closed every stream, then returns the router's snapshot
// after checking the conservation laws.
func (h *harness) idle() router.Snapshot {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.srv.AwaitIdle(ctx); err != nil {
		h.t.Fatalf("streams still open: %d", h.srv.Streams())
	}
	s := h.live.Snapshot()
	if broken := s.Conserved(); broken != "" {
		h.t.Fatalf("conservation: %s: %+v", broken, s.Counters)
	}
	return s
}

// held is what the router still holds: it must be zero once every stream closed.
func held(s router.Snapshot) router.Retained {
	r := s.Retained
	r.Samples = 0
	return r
}

// raw opens a bare ext_proc stream (no Envoy rules), for protocol violations.
func (h *harness) raw(ctx context.Context) extprocv3.ExternalProcessor_ProcessClient {
	h.t.Helper()
	ps, err := extprocv3.NewExternalProcessorClient(h.conn).Process(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	return ps
}

func hdrs(kv ...string) *extprocv3.HttpHeaders {
	hm := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return &extprocv3.HttpHeaders{Headers: hm}
}

func msgRequestHeaders(path string, eos bool) *extprocv3.ProcessingRequest {
	h := hdrs(":method", "POST", ":path", path, ":authority", "gw", "content-type", "application/json")
	h.EndOfStream = eos
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: h},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: extprocfilterv3.ProcessingMode_BUFFERED, ResponseBodyMode: extprocfilterv3.ProcessingMode_STREAMED}}
}

func msgRequestBody(body string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: eos}}}
}

func msgResponseHeaders(code int, ctype string, eos bool) *extprocv3.ProcessingRequest {
	h := hdrs(":status", fmt.Sprint(code), "content-type", ctype)
	h.EndOfStream = eos
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: h}}
}

func msgResponseBody(body string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: eos}}}
}

func msgRequestTrailers() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}}
}

func msgResponseTrailers() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}}
}

const completion = `{"model":"m","prompt":"hello there","max_tokens":8,"stream":true}`

// TestOneRequestPerStream (issue 7, finding 1): a message that does not fit the stream's phase
// ends it with InvalidArgument and releases what the request held. Before, a second request on
// a placed stream kept the first placement's prefill slot and KV forever.
func TestOneRequestPerStream(t *testing.T) {
	placed := []*extprocv3.ProcessingRequest{msgRequestHeaders("/v1/completions", false), msgRequestBody(completion, true)}
	cases := []struct {
		name    string
		msgs    []*extprocv3.ProcessingRequest // the last one is the violation
		replies int                            // replies before the violation
		want    string
		failed  uint64
	}{
		{"second request", append(placed[:2:2], msgRequestHeaders("/v1/completions", false)), 2, "request_headers a second time", 1},
		{"request body after the request ended", append(placed[:2:2], msgRequestBody("x", true)), 2, "request_body after the request ended", 1},
		{"response body before its headers", append(placed[:2:2], msgResponseBody("data: x\n\n", false)), 2, "response_body before response_headers", 1},
		{"response headers twice", append(placed[:2:2], msgResponseHeaders(200, "text/event-stream", false), msgResponseHeaders(200, "text/event-stream", false)), 3, "response_headers a second time", 1},
		{"response trailers twice", append(placed[:2:2], msgResponseHeaders(200, "text/event-stream", false), msgResponseTrailers(), msgResponseTrailers()), 4, "response_trailers a second time", 1},
		{"request trailers after the end", append(placed[:2:2], msgRequestTrailers()), 2, "request_trailers after the request ended", 1},
		{"response before the request was answered", []*extprocv3.ProcessingRequest{placed[0], msgResponseHeaders(200, "text/event-stream", false)}, 1, "response_headers before the request was answered", 0},
		{"a message before request headers", []*extprocv3.ProcessingRequest{msgResponseHeaders(200, "text/event-stream", false)}, 0, "a message before request_headers", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, relaxed(gateway.Mode{}), nil)
			// Eight such streams would have held every prefill slot (2 engines x 4) for good.
			for range 8 {
				ps := h.raw(context.Background())
				for i, m := range tc.msgs {
					if err := ps.Send(m); err != nil {
						t.Fatalf("send %d: %v", i, err)
					}
				}
				for i := 0; i < tc.replies; i++ {
					if _, err := ps.Recv(); err != nil {
						t.Fatalf("reply %d: %v", i, err)
					}
				}
				_, err := ps.Recv()
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("after the violation: %v, want InvalidArgument %q", err, tc.want)
				}
			}
			s := h.idle()
			if held(s) != (router.Retained{}) || s.Counters.Failed != 8*tc.failed {
				t.Fatalf("held %+v, failed %d", held(s), s.Counters.Failed)
			}
			// The slots are free: a normal request is placed at once.
			res, err := h.client.NewExchange(context.Background()).ProcessRequest(gateway.Request{
				Headers: gateway.NewRequestHeaders("POST", "/v1/completions", "gw", nil), Body: strings.NewReader(completion)})
			if err != nil || res.LocalReply != nil || res.Headers.Get(wire.HeaderDestination) == "" {
				t.Fatalf("next request: %+v %v", res, err)
			}
		})
	}
}

// exchange runs one request through the Envoy-faithful client; the response, when not nil, is
// played back through the response phases.
func (h *harness) exchange(ctx context.Context, body string, resp *gateway.Response) (*gateway.RequestResult, *gateway.Exchange) {
	h.t.Helper()
	x := h.client.NewExchange(ctx)
	res, err := x.ProcessRequest(gateway.Request{
		Headers: gateway.NewRequestHeaders("POST", "/v1/completions", "gw", http.Header{"Content-Type": {"application/json"}}),
		Body:    strings.NewReader(body)})
	if err != nil {
		h.t.Fatalf("request: %v", err)
	}
	if resp != nil && res.LocalReply == nil {
		if err := x.ProcessResponse(*resp, discard{}); err != nil {
			h.t.Fatalf("response: %v", err)
		}
		x.Close()
	}
	return res, x
}

type discard struct{}

func (discard) WriteHeaders(gateway.Headers) error { return nil }
func (discard) WriteBody([]byte) error             { return nil }

func sse(events ...string) *gateway.Response {
	var b strings.Builder
	for _, e := range events {
		b.WriteString("data: " + e + "\n\n")
	}
	b.WriteString("data: [DONE]\n\n")
	return &gateway.Response{Headers: gateway.NewResponseHeaders(200, http.Header{"Content-Type": {"text/event-stream"}}), Body: strings.NewReader(b.String())}
}

// TestUnplaceableAnsweredAtOnce (issue 7, finding 2): a request no engine of the fleet could
// hold is answered 400 at once and never enters the waiting set. Before, it sat at the head of
// the FIFO until it timed out, and every request behind it waited as long.
func TestUnplaceableAnsweredAtOnce(t *testing.T) {
	h := newHarness(t, relaxed(gateway.Mode{BufferLimit: 8 << 20}), func(c *config.Config) {
		c.Router.WaitingSet.MaxWaitS = 1
		p := c.Profiles["fast"]
		p.Decode.MaxKVTokens = 945000
		c.Profiles["fast"] = p
	})
	ids := strings.TrimSuffix(strings.Repeat("1,", 1_000_000), ",")
	for _, body := range []string{
		`{"model":"m","prompt":"hi","max_tokens":2147483647}`,
		`{"model":"m","prompt":[` + ids + `]}`,
	} {
		res, _ := h.exchange(context.Background(), body, nil) // before: a 504 after max_wait_s
		lr := res.LocalReply
		if lr == nil || lr.Status != 400 {
			t.Fatalf("%.60s...: %+v", body, res)
		}
		code, msg := errorOf(t, string(lr.Body))
		if code != "context_length_exceeded" || !strings.Contains(msg, "max_kv_tokens") || !strings.Contains(msg, "945000") {
			t.Fatalf("%q %q", code, msg)
		}
	}
	res, _ := h.exchange(context.Background(), completion, sse(`{"choices":[{"text":"a"}]}`))
	if res.LocalReply != nil {
		t.Fatalf("a normal request behind them: %+v", res.LocalReply)
	}
	s := h.idle()
	if c := s.Counters; c.Invalid != 2 || c.ContextLengthExceeded != 2 || c.Admitted != 1 || c.Completed != 1 || held(s) != (router.Retained{}) {
		t.Fatalf("%+v %+v", c, s.Retained)
	}
}

// TestUntrustedUsage (issue 7, finding 3): an absurd usage.completion_tokens from an engine does
// not poison the expected output of later requests, and nothing drifts. Before, the next
// request without max_tokens was never placed and awaiting_output_tokens stayed at 2e11.
func TestUntrustedUsage(t *testing.T) {
	h := newHarness(t, relaxed(gateway.Mode{}), func(c *config.Config) { c.Router.WaitingSet.MaxWaitS = 1 })
	noMax := `{"model":"m","prompt":"hello there","stream":true}`
	res, _ := h.exchange(context.Background(), noMax, sse(`{"choices":[{"text":"a"}]}`,
		`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1099511627776,"total_tokens":1099511627779}}`))
	if res.LocalReply != nil {
		t.Fatalf("first: %+v", res.LocalReply)
	}
	ctx, cancel := context.WithCancel(context.Background())
	res, x := h.exchange(ctx, noMax, nil)
	if res.LocalReply != nil || res.Headers.Get(wire.HeaderDestination) == "" {
		t.Fatalf("the next request without max_tokens was not placed: %+v", res.LocalReply)
	}
	cancel() // the client goes away before the response
	x.Close()
	s := h.idle()
	if held(s) != (router.Retained{}) || s.Counters.Completed != 1 || s.Counters.Cancelled.InFlight != 1 {
		t.Fatalf("%+v %+v", s.Retained, s.Counters)
	}
}

// TestSilentEngine (issue 7, finding 8): placements whose engine never sends a first token stop
// holding prefill slots after router.first_token_timeout_s, so the next request is placed.
// Before, eight silent placements held all eight slots and the ninth got no reply.
func TestSilentEngine(t *testing.T) {
	h := newHarness(t, relaxed(gateway.Mode{}), func(c *config.Config) {
		c.Router.FirstTokenTimeoutS = 0.2
		c.Router.WaitingSet.MaxWaitS = 5
	})
	var xs []*gateway.Exchange
	for i := range 8 { // 2 prefill engines x prefill_concurrency 4: every slot
		res, x := h.exchange(context.Background(), completion, nil)
		if res.LocalReply != nil {
			t.Fatalf("placement %d: %+v", i, res.LocalReply)
		}
		xs = append(xs, x)
	}
	begin := time.Now()
	res, x := h.exchange(context.Background(), completion, nil)
	if res.LocalReply != nil || res.Headers.Get(wire.HeaderDestination) == "" {
		t.Fatalf("ninth: %+v", res.LocalReply)
	}
	if d := time.Since(begin); d < 150*time.Millisecond { // placed by the timeout, not before (a 504 would have come at max_wait_s)
		t.Fatalf("ninth placed after %v, before first_token_timeout_s", d)
	}
	xs = append(xs, x)
	for i := range 7 { // the other silent ones free their slots as their timeouts pass
		res, x := h.exchange(context.Background(), completion, nil)
		if res.LocalReply != nil {
			t.Fatalf("placement %d after the timeouts: %+v", 10+i, res.LocalReply)
		}
		xs = append(xs, x)
	}
	// Timed-out requests count as decoding (their engine may still answer) until they end.
	s := h.live.Snapshot()
	if s.Counters.FirstTokenTimeouts < 8 || s.Retained.Decoding < 8 || s.Retained.Prefilling+s.Retained.Decoding != 16 {
		t.Fatalf("accounting after the timeouts: %+v %+v", s.Counters, s.Retained)
	}
	for _, x := range xs {
		x.Close()
	}
	if s := h.idle(); held(s) != (router.Retained{}) {
		t.Fatalf("%+v", s.Retained)
	}
}

// TestModelNameBounded (issue 7, finding 5): a model name over extproc.MaxModelBytes is a clear
// 400, and the sizing table keeps at most extproc.MaxTrackedModels models however many names
// clients send.
func TestModelNameBounded(t *testing.T) {
	h := newHarness(t, relaxed(gateway.Mode{BufferLimit: 8 << 20}), nil)
	res, _ := h.exchange(context.Background(), `{"model":"`+strings.Repeat("x", 1<<20)+`","prompt":"hi"}`, nil)
	if lr := res.LocalReply; lr == nil || lr.Status != 400 {
		t.Fatalf("%+v", res)
	}
	if _, msg := errorOf(t, string(res.LocalReply.Body)); !strings.Contains(msg, "1048576 bytes long; the limit is 256") {
		t.Fatalf("%q", msg)
	}
	for i := range 3 * extproc.MaxTrackedModels {
		model := fmt.Sprintf("%0256d", i)
		body := `{"model":"` + model + `","prompt":"` + strings.Repeat("word ", 40) + `","max_tokens":2,"stream":true}`
		if res, _ := h.exchange(context.Background(), body, sse(`{"choices":[{"text":"a"}]}`,
			`{"choices":[],"usage":{"prompt_tokens":50,"completion_tokens":2}}`)); res.LocalReply != nil {
			t.Fatalf("model %d: %+v", i, res.LocalReply)
		}
	}
	if n := len(h.sizer.Errors()); n != extproc.MaxTrackedModels {
		t.Fatalf("%d models tracked, want %d", n, extproc.MaxTrackedModels)
	}
	h.idle()
}

// TestPassiveHealth (issue 7, finding 6): upstream failures seen on the data path take the
// engine out of placement at once, without waiting for a probe. Before, every request went to
// a dead decode engine (the least loaded) until the probes noticed.
func TestPassiveHealth(t *testing.T) {
	h := newHarness(t, relaxed(gateway.Mode{}), nil, "prefill", "decode", "decode")
	fail := func() *gateway.Response { // what Envoy answers when the engine refuses connections
		return &gateway.Response{Headers: gateway.NewResponseHeaders(503, http.Header{"Content-Type": {"text/plain"}}),
			Body: strings.NewReader("upstream connect error or disconnect/reset before headers. reset reason: connection failure")}
	}
	dead := h.failInARow(fail, wire.HeaderDestination)
	var id string
	for _, e := range h.fleet.Snapshot().Engines {
		if e.Addr == dead {
			id = e.ID
			if e.Lifecycle != fleet.Failed {
				t.Fatalf("%s is %v after %d failures, want failed", id, e.Lifecycle, h.cfg.Health.Passive.ConsecutiveFailures)
			}
		}
	}
	for i := range 4 {
		res, _ := h.exchange(context.Background(), completion, sse(`{"choices":[{"text":"a"}]}`))
		if dest := res.Headers.Get(wire.HeaderDestination); dest == dead || dest == "" {
			t.Fatalf("request %d after the ejection went to %q", i, dest)
		}
	}
	s := h.idle()
	if s.Counters.Ejections != 1 || s.Counters.Failed != 3 || s.Counters.Completed != 4 {
		t.Fatalf("%+v", s.Counters)
	}
	for _, e := range s.Engines {
		if e.ID == id && !(e.Passive.ConsecutiveFailures == 0 && !e.Passive.Ejected) {
			t.Fatalf("once failed in the fleet the router leaves it to the probes: %+v", e.Passive)
		}
	}
}

// Passive health blames the leg that failed: llm-d's P/D sidecar in front of a decode engine
// answers a prefiller it cannot reach with a 502 without a body (docs/interop.md), and that
// counts against the prefill engine the request named, not the decode engine that relayed it.
// Before, a dead prefiller failed every healthy decode engine in turn (issue 33).
func TestPassiveHealthBlamesTheLegThatFailed(t *testing.T) {
	h := newHarness(t, relaxed(gateway.Mode{}), nil, "prefill", "prefill", "decode", "decode")
	prefillerDown := func() *gateway.Response {
		return &gateway.Response{Headers: gateway.NewResponseHeaders(502, http.Header{"Content-Length": {"0"}})}
	}
	dead := h.failInARow(prefillerDown, wire.HeaderPrefiller)
	for _, e := range h.fleet.Snapshot().Engines {
		switch {
		case e.Addr == dead && e.Lifecycle != fleet.Failed:
			t.Errorf("the prefiller %s is %v after %d bodiless 502s, want failed", e.ID, e.Lifecycle, h.cfg.Health.Passive.ConsecutiveFailures)
		case e.Addr != dead && e.Lifecycle != fleet.Active:
			t.Errorf("%s (%v) is %v: one engine's death failed another", e.ID, e.Role, e.Lifecycle)
		}
	}
	res, _ := h.exchange(context.Background(), completion, sse(`{"choices":[{"text":"a"}]}`))
	if p := res.Headers.Get(wire.HeaderPrefiller); p == dead || p == "" {
		t.Fatalf("after the ejection a request named prefiller %q", p)
	}
	if s := h.idle(); s.Counters.Ejections != 1 || s.Counters.Completed != 1 {
		t.Fatalf("%+v", s.Counters)
	}
}

// failInARow sends health.passive.consecutive_failures requests, each answered by fail, and
// returns the engine address header names on them: the same on every one (the least loaded
// engine, until the ejection).
func (h *harness) failInARow(fail func() *gateway.Response, header string) string {
	h.t.Helper()
	named := ""
	for i := 0; i < h.cfg.Health.Passive.ConsecutiveFailures; i++ {
		res, _ := h.exchange(context.Background(), completion, fail())
		if a := res.Headers.Get(header); named == "" {
			named = a
		} else if a != named {
			h.t.Fatalf("request %d named %s %s before the ejection, want %s", i, header, a, named)
		}
	}
	return named
}

// TestStreamLimit: streams beyond extproc.StreamLimit get a 503 overloaded reply, not a stall.
func TestStreamLimit(t *testing.T) {
	h := newHarness(t, relaxed(gateway.Mode{}), func(c *config.Config) { c.Router.WaitingSet.Capacity = 1 }, "prefill", "decode")
	limit := extproc.StreamLimit(h.cfg, h.fleet.Snapshot().Engines)
	if want := 1 + extproc.StreamMargin + 2*h.cfg.Profiles["fast"].Decode.MaxStreams; limit != want {
		t.Fatalf("limit %d, want %d", limit, want)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var open []extprocv3.ExternalProcessor_ProcessClient
	for range limit { // each holds its stream open after its request headers
		ps := h.raw(ctx)
		if err := ps.Send(msgRequestHeaders("/other", false)); err != nil {
			t.Fatal(err)
		}
		if _, err := ps.Recv(); err != nil {
			t.Fatal(err)
		}
		open = append(open, ps)
	}
	ps := h.raw(ctx)
	if err := ps.Send(msgRequestHeaders("/v1/completions", false)); err != nil {
		t.Fatal(err)
	}
	resp, err := ps.Recv()
	if ir := resp.GetImmediateResponse(); err != nil || ir.GetStatus().GetCode() != 503 || !strings.Contains(string(ir.GetBody()), "overloaded") {
		t.Fatalf("over the limit: %v %v", resp, err)
	}
	// A fleet that grows raises the limit: one more stream is served.
	h.srv.SetStreamLimit(limit + 2) // + the refused stream, if its end is not counted yet
	more := h.raw(ctx)
	if err := more.Send(msgRequestHeaders("/other", false)); err != nil {
		t.Fatal(err)
	}
	if resp, err := more.Recv(); err != nil || resp.GetImmediateResponse() != nil {
		t.Fatalf("under the raised limit: %v %v", resp, err)
	}
	open = append(open, more)
	for _, ps := range open {
		_ = ps.CloseSend()
		if _, err := ps.Recv(); err != io.EOF {
			t.Fatalf("close: %v", err)
		}
	}
	cancel()
	h.idle()
}
