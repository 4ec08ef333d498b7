package extproc_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/enginesim"
	"github.com/narwhal-llm/narwhal/extproc"
	"github.com/narwhal-llm/narwhal/extproc/envoytest"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/gateway"
	"github.com/narwhal-llm/narwhal/internal/logbuf"
	"github.com/narwhal-llm/narwhal/router"
	"github.com/narwhal-llm/narwhal/wire"
)

// fastProfile makes simulated engines quick: 2 ms to prefill a short prompt, 2 ms per token.
func fastProfile() config.Profile {
	return config.Profile{
		Prefill:            &config.PrefillCurve{BaseS: 0.002, PerTokenS: 1e-6, MaxTokens: 16384},
		PrefillConcurrency: 4,
		Decode:             &config.DecodeCurve{BaseS: 0.002, PerStreamS: 1e-5, MaxStreams: 64, MaxKVTokens: 1 << 20},
		KVTransferS:        0.001,
	}
}

// fixture is a real ext_proc server, router and fleet, real enginesim engines on loopback, and
// the Envoy-faithful test gateway in front.
type fixture struct {
	t       *testing.T
	cfg     *config.Config
	fleet   *fleet.Fleet
	live    *router.Live
	engines map[string]*httptest.Server
	addr    map[string]string // engine id -> IP:port
	gw      *gateway.Gateway
	url     string
	extproc string
}

// relaxed is the filter config of most tests: BUFFERED request body, STREAMED response body,
// mode override allowed, envoy.lb metadata received, and a message timeout above any wait.
func relaxed(body gateway.Mode) gateway.Mode {
	m := gateway.Mode{
		RequestBody: gateway.Buffered, ResponseBody: gateway.Streamed, AllowModeOverride: true,
		MessageTimeout: 30 * time.Second, ReceivingNamespaces: []string{"envoy.lb"},
	}
	if body.RequestBody != 0 {
		m.RequestBody = body.RequestBody
	}
	if body.ResponseBody != 0 {
		m.ResponseBody = body.ResponseBody
	}
	if body.BufferLimit != 0 {
		m.BufferLimit = body.BufferLimit
	}
	return m
}

func newFixture(t *testing.T, mode gateway.Mode, tweak func(*config.Config), roles ...string) *fixture {
	t.Helper()
	return newFixtureWith(t, mode, tweak, nil, roles...)
}

// newFixtureWith is newFixture with the server's options edited by edit (when not nil).
func newFixtureWith(t *testing.T, mode gateway.Mode, tweak func(*config.Config), edit func(*extproc.Options), roles ...string) *fixture {
	t.Helper()
	if len(roles) == 0 {
		roles = []string{"prefill", "prefill", "decode", "decode"}
	}
	cfg := config.Default()
	cfg.Router.LocalPrefill = config.LocalPrefillOff // the disaggregated wire; TestLocalPrefill has the local one
	cfg.Profiles = map[string]config.Profile{"fast": fastProfile()}
	fx := &fixture{t: t, cfg: cfg, engines: map[string]*httptest.Server{}, addr: map[string]string{}}
	for i, role := range roles {
		id := fmt.Sprintf("e%d", i+1)
		eng := enginesim.New(enginesim.Options{Profile: fastProfile(), Role: role, Model: "m", Seed: int64(i + 1), DefaultOutputTokens: 8})
		srv := httptest.NewServer(eng)
		t.Cleanup(func() { srv.Close(); eng.Close() })
		fx.engines[id] = srv
		fx.addr[id] = strings.TrimPrefix(srv.URL, "http://")
		cfg.Engines = append(cfg.Engines, config.Engine{ID: id, Address: fx.addr[id], Role: role, Profile: "fast"})
	}
	fx.fleet, fx.live = startRouter(t, cfg, tweak)
	sizer, err := extproc.NewSizer(cfg.Router.Sizing)
	if err != nil {
		t.Fatal(err)
	}
	opts := extproc.Options{Router: cfg.Router, Placer: fx.live, Sizer: sizer}
	if edit != nil {
		edit(&opts)
	}
	srv := extproc.NewServer(opts)
	fx.extproc = envoytest.StartServer(t, srv, extproc.GRPCServerOptions(cfg)...)
	var hs *httptest.Server
	fx.gw, hs = envoytest.StartGateway(t, fx.extproc, mode, gateway.WithRoutedPaths(cfg.Router.Paths...),
		gateway.WithDefaultUpstream(fx.addr["e1"]))
	fx.url = hs.URL
	return fx
}

// post sends one request through the gateway and returns the status, headers and whole body.
func (fx *fixture) post(ctx context.Context, path, body string, hdr map[string]string) (int, http.Header, string) {
	fx.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fx.url+path, strings.NewReader(body))
	if err != nil {
		fx.t.Fatal(err)
	}
	req.Header.Set("content-type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// settle waits until the router holds nothing, checking conservation at every change.
func (fx *fixture) settle() router.Snapshot {
	fx.t.Helper()
	var last router.Snapshot
	fx.await("the router holds nothing", func(s router.Snapshot) bool {
		if broken := s.Conserved(); broken != "" {
			fx.t.Errorf("conservation broken: %s: %+v", broken, s.Counters)
			return true
		}
		last = s
		return s.Retained.Waiting+s.Retained.Prefilling+s.Retained.Decoding == 0
	})
	if fx.t.Failed() {
		fx.t.FailNow()
	}
	return last
}

// await waits (10 s at most) until cond holds for the router's snapshot, woken by its changes.
func (fx *fixture) await(what string, cond func(router.Snapshot) bool) {
	fx.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := fx.live.Await(ctx, cond); err != nil {
		fx.t.Fatalf("waiting until %s: %v; %+v", what, err, fx.live.Snapshot())
	}
}

func (fx *fixture) lastOutcome() gateway.Outcome {
	fx.t.Helper()
	outs := fx.gw.Outcomes()
	if len(outs) == 0 {
		fx.t.Fatal("the gateway recorded no request")
	}
	return outs[len(outs)-1]
}

func chat(stream bool, maxTokens int) string {
	return fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hello there, how are you today?"}],"max_tokens":%d,"stream":%v}`, maxTokens, stream)
}

func TestDisaggregatedPlacement(t *testing.T) {
	for _, body := range []gateway.Mode{{RequestBody: gateway.Buffered}, {RequestBody: gateway.FullDuplex, ResponseBody: gateway.FullDuplex}} {
		t.Run(body.RequestBody.String(), func(t *testing.T) {
			fx := newFixture(t, relaxed(body), nil)
			code, _, got := fx.post(context.Background(), "/v1/chat/completions", chat(true, 5), nil)
			if code != 200 || strings.Count(got, "data: ") != 5+2 || !strings.Contains(got, `"usage"`) {
				t.Fatalf("%d %q", code, got)
			}
			o := fx.lastOutcome()
			dest, pre := o.Placement.Get(wire.HeaderDestination), o.Placement.Get(wire.HeaderPrefiller)
			if o.Placement.Get(wire.HeaderPlacement) != "disaggregated" || o.Upstream != dest {
				t.Fatalf("placement %v, upstream %s", o.Placement, o.Upstream)
			}
			if dest != fx.addr["e3"] && dest != fx.addr["e4"] {
				t.Fatalf("destination %s is not a decode engine", dest)
			}
			if pre != fx.addr["e1"] && pre != fx.addr["e2"] {
				t.Fatalf("prefiller %s is not a prefill engine", pre)
			}
			if o.Record.Metadata("envoy.lb", wire.HeaderDestination) != dest || !o.Record.RouteCacheCleared {
				t.Fatalf("metadata %v, route cache cleared %v", o.Record.DynamicMetadata, o.Record.RouteCacheCleared)
			}
			if len(o.Record.Violations) != 0 {
				t.Fatalf("Envoy would object: %+v", o.Record.Violations)
			}
			s := fx.settle()
			if s.Counters.Completed != 1 || s.Counters.Dispatched.Disaggregated != 1 {
				t.Fatalf("%+v", s.Counters)
			}
		})
	}
}

func TestPromptForms(t *testing.T) {
	fx := newFixture(t, relaxed(gateway.Mode{}), nil)
	bodies := map[string]string{
		"string":          `{"model":"m","prompt":"once upon a time","max_tokens":2}`,
		"strings":         `{"model":"m","prompt":["once upon","a time"],"max_tokens":2}`,
		"token ids":       `{"model":"m","prompt":[1,2,3,4],"max_tokens":2}`,
		"token id arrays": `{"model":"m","prompt":[[1,2],[3,4]],"max_tokens":2}`,
	}
	for name, body := range bodies {
		if code, _, got := fx.post(context.Background(), "/v1/completions", body, nil); code != 200 {
			t.Errorf("completions %s: %d %s", name, code, got)
		}
	}
	chats := map[string]string{
		"string content": `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"max_completion_tokens":2}`,
		"content parts":  `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:,"}}]}],"max_tokens":2}`,
	}
	for name, body := range chats {
		if code, _, got := fx.post(context.Background(), "/v1/chat/completions", body, nil); code != 200 {
			t.Errorf("chat %s: %d %s", name, code, got)
		}
	}
	s := fx.settle()
	if s.Counters.Completed != 6 || s.Counters.Invalid != 0 {
		t.Fatalf("%+v", s.Counters)
	}
}

// errorOf decodes an OpenAI-style error body.
func errorOf(t *testing.T, body string) (code, message string) {
	t.Helper()
	var e struct {
		Error struct{ Message, Type, Code string } `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code == "" || e.Error.Type == "" {
		t.Fatalf("not an error object: %q (%v)", body, err)
	}
	return e.Error.Code, e.Error.Message
}

func TestInvalidRequests(t *testing.T) {
	fx := newFixture(t, relaxed(gateway.Mode{BufferLimit: -1}), func(c *config.Config) { c.Router.BodyLimitBytes = 4096 })
	cases := []struct {
		name, path, body string
		status           int
		code, says       string
	}{
		{"not json", "/v1/completions", `{"model":`, 400, "invalid_request", "JSON"},
		{"no model", "/v1/completions", `{"prompt":"x"}`, 400, "invalid_request", "model"},
		{"no prompt", "/v1/completions", `{"model":"m"}`, 400, "invalid_request", "prompt"},
		{"no messages", "/v1/chat/completions", `{"model":"m","prompt":"x"}`, 400, "invalid_request", "messages"},
		{"bad max_tokens", "/v1/completions", `{"model":"m","prompt":"x","max_tokens":-3}`, 400, "invalid_request", "max_tokens"},
		{"bad stream", "/v1/completions", `{"model":"m","prompt":"x","stream":"yes"}`, 400, "invalid_request", "stream"},
		{"empty body", "/v1/completions", ``, 400, "invalid_request", ""},
		{"too large", "/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("x", 5000) + `"}`, 413, "body_too_large", "limit"},
	}
	for _, c := range cases {
		code, hdr, body := fx.post(context.Background(), c.path, c.body, nil)
		if code != c.status || hdr.Get("content-type") != "application/json" {
			t.Errorf("%s: %d %s %q", c.name, code, hdr.Get("content-type"), body)
			continue
		}
		gotCode, msg := errorOf(t, body)
		if gotCode != c.code || !strings.Contains(msg, c.says) {
			t.Errorf("%s: code %s message %q", c.name, gotCode, msg)
		}
	}
	s := fx.settle()
	if s.Counters.Offers != uint64(len(cases)) || s.Counters.Invalid != uint64(len(cases)) || s.Counters.Admitted != 0 {
		t.Fatalf("%+v", s.Counters)
	}
}

// hold fills every prefill slot of the fleet with requests that never finish, so that the next
// offer waits; it returns a release function.
func (fx *fixture) hold(n int) func() {
	fx.t.Helper()
	var hs []router.Handle
	for i := 0; i < n; i++ {
		out, err := fx.live.Offer(context.Background(), router.Offer{ID: "hold", PromptTokens: 10, MaxTokens: 1})
		if err != nil || out.Status != router.Dispatched {
			fx.t.Fatalf("hold %d: %+v %v", i, out, err)
		}
		hs = append(hs, out.Handle)
	}
	return func() {
		for _, h := range hs {
			_ = fx.live.Complete(h, 1)
		}
	}
}

func TestRejections(t *testing.T) {
	t.Run("waiting_set_full and wait_timeout", func(t *testing.T) {
		fx := newFixture(t, relaxed(gateway.Mode{}), func(c *config.Config) {
			c.Router.WaitingSet.Capacity = 1
			c.Router.WaitingSet.MaxWaitS = 0.3
		}, "prefill", "decode")
		release := fx.hold(4)
		defer release()
		var wg sync.WaitGroup
		var waited int
		var waitedBody string
		wg.Go(func() {
			waited, _, waitedBody = fx.post(context.Background(), "/v1/completions", `{"model":"m","prompt":"a"}`, nil)
		})
		fx.await("the first one waits", func(s router.Snapshot) bool { return s.Retained.Waiting == 1 })
		code, hdr, body := fx.post(context.Background(), "/v1/completions", `{"model":"m","prompt":"b"}`, nil)
		if c, _ := errorOf(t, body); code != 429 || c != "waiting_set_full" || hdr.Get("retry-after") == "" {
			t.Fatalf("second: %d %q retry-after %q", code, body, hdr.Get("retry-after"))
		}
		wg.Wait()
		if c, _ := errorOf(t, waitedBody); waited != 504 || c != "wait_timeout" {
			t.Fatalf("first: %d %q", waited, waitedBody)
		}
	})
	t.Run("predicted_slo_miss", func(t *testing.T) {
		fx := newFixture(t, relaxed(gateway.Mode{}), func(c *config.Config) {
			c.Router.Admission.RejectRatio = 1
			c.SLO.TTFTS = 0.001 // any prompt misses it
		})
		code, hdr, body := fx.post(context.Background(), "/v1/completions", `{"model":"m","prompt":"a"}`, nil)
		if c, _ := errorOf(t, body); code != 429 || c != "predicted_slo_miss" || hdr.Get("retry-after") != "1" {
			t.Fatalf("%d %q %v", code, body, hdr)
		}
	})
	t.Run("no_capacity", func(t *testing.T) {
		fx := newFixture(t, relaxed(gateway.Mode{}), func(c *config.Config) { c.Controller.MinDecode = 0 }, "prefill", "prefill")
		code, _, body := fx.post(context.Background(), "/v1/completions", `{"model":"m","prompt":"a"}`, nil)
		if c, _ := errorOf(t, body); code != 503 || c != "no_capacity" {
			t.Fatalf("%d %q", code, body)
		}
	})
	t.Run("streamed request body is refused", func(t *testing.T) {
		fx := newFixture(t, relaxed(gateway.Mode{RequestBody: gateway.Streamed}), nil)
		code, _, body := fx.post(context.Background(), "/v1/completions", `{"model":"m","prompt":"a"}`, nil)
		if c, msg := errorOf(t, body); code != 500 || c != "unsupported_body_mode" || !strings.Contains(msg, "BUFFERED") {
			t.Fatalf("%d %q", code, body)
		}
		if d := fx.lastOutcome().LocalReply.Details; d != "narwhal_streamed_request_body_mode" {
			t.Fatalf("details %q", d)
		}
		// Other paths still pass through.
		if code, _, _ := fx.post(context.Background(), "/health", "", nil); code != 405 && code != 200 {
			t.Fatalf("pass-through: %d", code)
		}
	})
}

// TestClientRoutingHeadersIgnored: a client cannot choose the engine.
func TestClientRoutingHeadersIgnored(t *testing.T) {
	fx := newFixture(t, relaxed(gateway.Mode{}), nil)
	evil := map[string]string{
		wire.HeaderDestination: "10.9.9.9:1", wire.HeaderPrefiller: "10.9.9.9:2",
		"x-narwhal-placement": "aggregate", "x-narwhal-decode-host-port": "10.9.9.9:3",
	}
	code, _, body := fx.post(context.Background(), "/v1/completions", `{"model":"m","prompt":"a","max_tokens":1}`, evil)
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	o := fx.lastOutcome()
	for _, k := range []string{wire.HeaderDestination, wire.HeaderPrefiller, wire.HeaderPlacement} {
		if v := o.Placement.Values(k); len(v) != 1 || strings.HasPrefix(v[0], "10.9.9.9") || v[0] == "aggregate" {
			t.Fatalf("%s = %v", k, v)
		}
	}
	if v := o.Placement.Values("x-narwhal-decode-host-port"); len(v) != 0 {
		t.Fatalf("client's x-narwhal-decode-host-port survived: %v", v)
	}
	// A path Narwhal does not place: the client's headers are removed, and the destination is
	// the engine Narwhal picks (TestPassThrough), never the client's.
	code, _, _ = fx.post(context.Background(), "/v1/models", "", evil)
	o = fx.lastOutcome()
	if v := o.Placement.Values(wire.HeaderDestination); len(v) != 1 || strings.HasPrefix(v[0], "10.9.9.9") || len(o.Placement.Values(wire.HeaderPrefiller)) > 0 {
		t.Fatalf("pass-through: %d route %s headers %v", code, o.Route, o.Placement)
	}
}

// Behind a Gateway API Inference Extension gateway every request goes through the picker and to
// the endpoint it names: a request Narwhal does not place (/v1/models, /v1/embeddings, /health)
// is sent to a live engine, the least loaded, a prefill engine for a prompt-only request, and
// counted apart from the offers. (Before, it got no destination: 503 no healthy upstream.)
func TestPassThrough(t *testing.T) {
	fx := newFixture(t, relaxed(gateway.Mode{}), nil)
	gw, hs := envoytest.StartGateway(t, fx.extproc, relaxed(gateway.Mode{}), gateway.WithAllPathsRouted())
	get := func(method, path string) (int, gateway.Outcome) {
		t.Helper()
		return through(t, gw, hs.URL, method, path, `{"model":"m","input":"hello"}`, nil)
	}
	engineOf := func(o gateway.Outcome) string {
		for id, addr := range fx.addr {
			if addr == o.Destination {
				return id
			}
		}
		return "none (" + o.Destination + ")"
	}
	seen := map[string]bool{}
	for range 4 { // idle engines: each in turn
		code, o := get(http.MethodGet, "/v1/models")
		if code != 200 || o.Route != gateway.RouteOriginalDst {
			t.Fatalf("GET /v1/models: %d, route %s to %q", code, o.Route, o.Destination)
		}
		seen[engineOf(o)] = true
	}
	if len(seen) != 4 {
		t.Errorf("four idle engines, GET /v1/models went to %v", seen)
	}
	for _, path := range []string{"/v1/embeddings", "/tokenize"} {
		if _, o := get(http.MethodPost, path); engineOf(o) != "e1" && engineOf(o) != "e2" {
			t.Errorf("POST %s went to %s, not a prefill engine", path, engineOf(o))
		}
	}
	if code, o := get(http.MethodGet, "/health"); code != 200 || o.Destination == "" {
		t.Errorf("GET /health: %d to %q", code, o.Destination)
	}
	s := fx.settle()
	if s.Counters.PassedThrough != 7 || s.Counters.Offers != 0 {
		t.Fatalf("passed_through %d, offers %d: want 7 and 0", s.Counters.PassedThrough, s.Counters.Offers)
	}
	// With no engine live the request goes on without a destination (the route decides).
	for _, id := range []string{"e1", "e2", "e3", "e4"} {
		if _, err := fx.fleet.SetLifecycle(id, fleet.Failed, time.Now(), "test"); err != nil {
			t.Fatal(err)
		}
	}
	fx.live.SetFleet(fx.fleet.Snapshot())
	if code, o := get(http.MethodGet, "/v1/models"); code != 503 || o.Destination != "" {
		t.Fatalf("no live engine: %d to %q", code, o.Destination)
	}
}

// A whole (non-streamed) JSON response carries usage whether the client asked or not: with the
// bytes sizing, Narwhal reads its body and calibrates on it (issue 33: sizing calibrated only
// on streams that asked for usage). With bpe sizing nothing calibrates, and the body is skipped.
func TestNonStreamingResponse(t *testing.T) {
	t.Run("bytes sizing reads its usage", func(t *testing.T) {
		var sizer *extproc.Sizer
		fx := newFixtureWith(t, relaxed(gateway.Mode{}), nil, func(o *extproc.Options) { sizer = o.Sizer })
		code, _, body := fx.post(context.Background(), "/v1/completions", `{"model":"m","prompt":"abc","max_tokens":3}`, nil)
		if code != 200 || !strings.Contains(body, `"usage"`) {
			t.Fatalf("%d %s", code, body)
		}
		if o := fx.lastOutcome(); o.Record.Timings.ResponseBodyMessages == 0 {
			t.Fatalf("the body was not observed: mode overrides %v", o.Record.ModeOverrides)
		}
		if s := fx.settle(); s.Counters.Completed != 1 {
			t.Fatalf("%+v", s.Counters)
		}
		if e := sizer.Errors(); len(e) != 1 || e[0].Model != "m" || e[0].Samples != 1 {
			t.Fatalf("sizing samples %+v, want one for model m", e)
		}
	})
	t.Run("bpe sizing skips the body", func(t *testing.T) {
		fx := newFixture(t, relaxed(gateway.Mode{}), func(c *config.Config) { c.Router.Sizing.Method = config.SizingBPE })
		code, _, body := fx.post(context.Background(), "/v1/completions", `{"model":"m","prompt":"abc","max_tokens":3}`, nil)
		if code != 200 || !strings.Contains(body, `"usage"`) {
			t.Fatalf("%d %s", code, body)
		}
		if o := fx.lastOutcome(); o.Record.ModeOverrides == 0 || o.Record.Timings.ResponseBodyMessages != 0 {
			t.Fatalf("mode overrides %v, body messages %d", o.Record.ModeOverrides, o.Record.Timings.ResponseBodyMessages)
		}
		if s := fx.settle(); s.Counters.Completed != 1 {
			t.Fatalf("%+v", s.Counters)
		}
	})
}

func TestCancelWhileWaiting(t *testing.T) {
	fx := newFixture(t, relaxed(gateway.Mode{}), nil, "prefill", "decode")
	release := fx.hold(4)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	code, _, _ := fx.post(ctx, "/v1/completions", `{"model":"m","prompt":"a"}`, nil)
	if code != 0 {
		t.Fatalf("a cancelled request got %d", code)
	}
	fx.await("the cancel is recorded", func(s router.Snapshot) bool { return s.Counters.Cancelled.Waiting == 1 })
	release()
	fx.settle()
}

func TestCancelWhileStreaming(t *testing.T) {
	fx := newFixture(t, relaxed(gateway.Mode{}), nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fx.url+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"a","max_tokens":5000,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q %v", line, err)
	}
	cancel()
	resp.Body.Close()
	fx.await("the cancel is recorded", func(s router.Snapshot) bool { return s.Counters.Cancelled.InFlight == 1 })
	s := fx.settle()
	if s.Counters.Completed != 0 || s.Counters.Dispatched.Disaggregated != 1 {
		t.Fatalf("%+v", s.Counters)
	}
}

// TestEngineKilled: a decode engine dies with streams on it; the requests end (failed or
// cancelled in flight), nothing leaks, and new requests go to the other decode engine.
func TestEngineKilled(t *testing.T) {
	fx := newFixture(t, relaxed(gateway.Mode{}), nil, "prefill", "decode", "decode")
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ {
		wg.Go(func() {
			fx.post(context.Background(), "/v1/completions", `{"model":"m","prompt":"a","max_tokens":400,"stream":true}`, nil)
		})
	}
	fx.await("six streams decode", func(s router.Snapshot) bool { return s.Retained.Decoding >= 6 })
	fx.engines["e2"].CloseClientConnections()
	fx.engines["e2"].Close()
	if _, err := fx.fleet.SetLifecycle("e2", fleet.Failed, time.Now(), "test"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	s := fx.settle()
	if s.Counters.Completed+s.Counters.Failed+s.Counters.Cancelled.InFlight != 6 || s.Counters.Cancelled.InFlight+s.Counters.Failed == 0 {
		t.Fatalf("%+v", s.Counters)
	}
	code, _, body := fx.post(context.Background(), "/v1/completions", `{"model":"m","prompt":"a","max_tokens":2}`, nil)
	if o := fx.lastOutcome(); code != 200 || o.Upstream != fx.addr["e3"] {
		t.Fatalf("after the failure: %d %s via %s", code, body, o.Upstream)
	}
}

// TestAggregateFallback runs docs/role-control.md section 8 through the data path: both prefill
// engines drained → the fallback refuses new work until its decode residents drain → aggregate
// placements (no prefiller header) → a prefill engine returns → disaggregated again.
func TestAggregateFallback(t *testing.T) {
	fx := newFixture(t, relaxed(gateway.Mode{}), func(c *config.Config) { c.Router.WaitingSet.MaxWaitS = 0.2 })
	long := `{"model":"m","prompt":"a","max_tokens":300,"stream":true}`
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Go(func() {
			if code, _, body := fx.post(context.Background(), "/v1/completions", long, nil); code != 200 {
				t.Errorf("resident: %d %s", code, body)
			}
		})
	}
	fx.await("two residents decode", func(s router.Snapshot) bool { return s.Retained.Decoding >= 2 })
	for _, id := range []string{"e1", "e2"} {
		if _, err := fx.fleet.Drain(id, time.Now(), "test", fleet.Floors{}); err != nil {
			t.Fatal(err)
		}
	}
	// The residents project ~0.6 s of decode, beyond max_wait_s: refused.
	code, hdr, body := fx.post(context.Background(), "/v1/completions", `{"model":"m","prompt":"b","max_tokens":2}`, nil)
	if c, _ := errorOf(t, body); code != 429 || c != "fallback_busy" || hdr.Get("retry-after") == "" {
		t.Fatalf("during the drain: %d %q", code, body)
	}
	wg.Wait() // the residents finish
	code, _, body = fx.post(context.Background(), "/v1/completions", `{"model":"m","prompt":"c","max_tokens":2,"stream":true}`, nil)
	o := fx.lastOutcome()
	if code != 200 || o.Placement.Get(wire.HeaderPlacement) != "aggregate" || o.Placement.Get(wire.HeaderPrefiller) != "" {
		t.Fatalf("fallback: %d %q placement %v", code, body, o.Placement)
	}
	if o.Upstream != fx.addr["e3"] && o.Upstream != fx.addr["e4"] {
		t.Fatalf("aggregate on %s, not a decode engine", o.Upstream)
	}
	if s := fx.live.Snapshot(); s.Fallback == "" || s.Counters.Dispatched.Aggregate != 1 {
		t.Fatalf("%+v", s)
	}
	// A prefill engine is live again.
	if _, err := fx.fleet.Undrain("e1", time.Now(), "test"); err != nil {
		t.Fatal(err)
	}
	for _, l := range []fleet.Lifecycle{fleet.Recovering, fleet.Active} {
		if _, err := fx.fleet.SetLifecycle("e1", l, time.Now(), "test"); err != nil {
			t.Fatal(err)
		}
	}
	fx.await("the fallback ends", func(s router.Snapshot) bool { return s.Fallback == "" })
	code, _, _ = fx.post(context.Background(), "/v1/completions", `{"model":"m","prompt":"d","max_tokens":2}`, nil)
	o = fx.lastOutcome()
	if code != 200 || o.Placement.Get(wire.HeaderPlacement) != "disaggregated" || o.Placement.Get(wire.HeaderPrefiller) != fx.addr["e1"] {
		t.Fatalf("after: %d placement %v", code, o.Placement)
	}
	s := fx.settle()
	if s.Counters.Overflow.FallbackBusy != 1 || s.Counters.Completed != 4 {
		t.Fatalf("%+v", s.Counters)
	}
}

// TestLocalPrefill: a request a decode engine prefills itself (router.local_prefill) goes out as
// llm-d's decode-only path — the decode engine the destination, no prefiller header, the
// placement header's "aggregate" — and the engine serves it whole.
func TestLocalPrefill(t *testing.T) {
	fx := newFixture(t, relaxed(gateway.Mode{}), func(c *config.Config) { c.Router.LocalPrefill = config.LocalPrefillAlways })
	code, _, body := fx.post(context.Background(), "/v1/completions", `{"model":"m","prompt":"a b c","max_tokens":3,"stream":true}`, nil)
	o := fx.lastOutcome()
	if code != 200 || o.Placement.Get(wire.HeaderPlacement) != "aggregate" || len(o.Placement.Values(wire.HeaderPrefiller)) > 0 {
		t.Fatalf("local: %d %q placement %v", code, body, o.Placement)
	}
	if o.Upstream != fx.addr["e3"] && o.Upstream != fx.addr["e4"] {
		t.Fatalf("local prefill on %s, not a decode engine", o.Upstream)
	}
	if !strings.Contains(string(body), "[DONE]") {
		t.Fatalf("the decode engine did not serve it whole: %q", body)
	}
	s := fx.settle()
	if d := s.Counters.Dispatched; d.Local != 1 || d.Aggregate != 1 || d.Disaggregated != 0 || s.Counters.LocalPromptTokens == 0 || s.Counters.Completed != 1 {
		t.Fatalf("%+v", s.Counters)
	}
}

// TestFullDuplexPassThrough: in full duplex Envoy forwards only the body the processor sends
// back, so a request on an unrouted path must have its body echoed unchanged.
func TestFullDuplexPassThrough(t *testing.T) {
	fx := newFixture(t, relaxed(gateway.Mode{RequestBody: gateway.FullDuplex, ResponseBody: gateway.FullDuplex}), nil)
	body := `{"input":"not routed"}`
	code, _, _ := fx.post(context.Background(), "/v1/embeddings", body, nil)
	o := fx.lastOutcome()
	if o.Route != gateway.RouteDefault || string(o.Record.RequestBody) != body || len(o.Record.Violations) != 0 {
		t.Fatalf("%d route %s body %q violations %+v", code, o.Route, o.Record.RequestBody, o.Record.Violations)
	}
	if s := fx.settle(); s.Counters.Offers != 0 {
		t.Fatalf("an unrouted path was offered: %+v", s.Counters)
	}
}

// refusing is the live router, except that it refuses every completion after recording it.
type refusing struct{ *router.Live }

func (p refusing) Complete(h router.Handle, n int) error {
	_ = p.Live.Complete(h, n)
	return errors.New("router: unknown request")
}

// A response event the router refuses is not dropped: the data path logs it with the request id
// and counts it, and the client's exchange goes on untouched. Before, the error was discarded.
func TestRouterErrorsAreLoggedAndCounted(t *testing.T) {
	var logs logbuf.Buffer
	reg := prometheus.NewRegistry()
	fx := newFixtureWith(t, relaxed(gateway.Mode{}), nil, func(o *extproc.Options) {
		o.Placer = refusing{o.Placer.(*router.Live)}
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		o.Metrics = extproc.NewMetrics(reg)
	}, "prefill", "decode")
	code, _, body := fx.post(context.Background(), "/v1/completions", `{"model":"m","prompt":"a","max_tokens":3}`, map[string]string{"x-request-id": "req-7"})
	if code != 200 {
		t.Fatalf("the client got %d %s", code, body)
	}
	fx.settle()
	if got := counterValue(t, reg, "narwhal_extproc_router_errors_total", "complete"); got != 1 {
		t.Fatalf("narwhal_extproc_router_errors_total{event=complete} = %v, want 1", got)
	}
	if l := logs.String(); !strings.Contains(l, "request_id=req-7") || !strings.Contains(l, "event=complete") {
		t.Fatalf("log:\n%s", l)
	}
}

// counterValue is the value of the counter name{...=label} in reg (0 when absent).
func counterValue(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) > 0 && m.GetLabel()[0].GetValue() == label {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// through sends one request through a test's own gateway at url and returns its status and the
// gateway's outcome of it.
func through(t *testing.T, gw *gateway.Gateway, url, method, path, body string, hdr map[string]string) (int, gateway.Outcome) {
	t.Helper()
	req, _ := http.NewRequest(method, url+path, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	outs := gw.Outcomes()
	return resp.StatusCode, outs[len(outs)-1]
}

// The Gateway API Inference Extension's subset hint: a gateway forwards, in the filter
// metadata of its ext_proc requests (envoy.lb.subset_hint), the endpoints the picker must
// choose among. A placed request's destination and a passed-through request's engine are among
// them; a hint naming no engine that can be the destination is answered 503
// subset_unavailable, as the protocol asks. (Before, the hint was ignored.)
func TestSubsetHint(t *testing.T) {
	fx := newFixture(t, relaxed(gateway.Mode{}), nil)
	mode := relaxed(gateway.Mode{})
	mode.ForwardingNamespaces = []string{wire.SubsetNamespace}
	gw, hs := envoytest.StartGateway(t, fx.extproc, mode, gateway.WithAllPathsRouted(),
		gateway.WithFilterMetadata(func(r *http.Request) map[string]*structpb.Struct {
			ids := r.Header.Get("test-subset") // which engines the test's gateway names
			if ids == "" {
				return nil
			}
			var list []any
			for _, id := range strings.Split(ids, ",") {
				addr, ok := fx.addr[id]
				if !ok {
					addr = id // an address no engine has
				}
				list = append(list, addr)
			}
			ns, err := structpb.NewStruct(map[string]any{wire.SubsetKey: list})
			if err != nil {
				t.Error(err)
			}
			return map[string]*structpb.Struct{wire.SubsetNamespace: ns}
		}))
	send := func(path, body, subset string) (int, gateway.Outcome) {
		t.Helper()
		method := http.MethodPost
		if body == "" {
			method = http.MethodGet
		}
		return through(t, gw, hs.URL, method, path, body, map[string]string{"content-type": "application/json", "test-subset": subset})
	}
	completion := `{"model":"m","prompt":"hello","max_tokens":3,"stream":true}`
	for range 3 {
		if code, o := send("/v1/completions", completion, "e4"); code != 200 || o.Destination != fx.addr["e4"] {
			t.Fatalf("subset e4: %d to %q", code, o.Destination)
		}
	}
	if code, o := send("/v1/models", "", "e2"); code != 200 || o.Destination != fx.addr["e2"] {
		t.Fatalf("pass-through, subset e2: %d to %q", code, o.Destination)
	}
	code, o := send("/v1/completions", completion, "e1,e2") // prefill engines only: no destination
	if code != 503 || o.LocalReply == nil || !strings.Contains(string(o.LocalReply.Body), "subset_unavailable") {
		t.Fatalf("subset of prefill engines: %d %+v", code, o.LocalReply)
	}
	if code, o := send("/v1/models", "", "10.9.9.9:1"); code != 503 || o.LocalReply == nil || !strings.Contains(string(o.LocalReply.Body), "subset_unavailable") {
		t.Fatalf("pass-through, a subset of no engine: %d %+v", code, o.LocalReply)
	}
	if s := fx.settle(); s.Counters.Overflow.SubsetUnavailable != 1 {
		t.Fatalf("overflow %+v", s.Counters.Overflow)
	}
}
