package enginesim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/internal/poll"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fastProfile keeps tests quick: 1 ms per prefill, 1 ms per decode step.
func fastProfile() config.Profile {
	return config.Profile{
		Prefill:     &config.PrefillCurve{BaseS: 0.001},
		Decode:      &config.DecodeCurve{BaseS: 0.001, MaxStreams: 64, MaxKVTokens: 1 << 20},
		KVTransferS: 0.001,
	}
}

// testEngine is an Engine behind a loopback HTTP server, with its own client.
type testEngine struct {
	*Engine
	url      string
	hostport string
	client   *http.Client
}

func startEngine(t testing.TB, o Options) *testEngine {
	t.Helper()
	return serveEngine(t, New(o), nil)
}

// serveEngine serves e, optionally wrapped, until the test ends.
func serveEngine(t testing.TB, e *Engine, wrap func(http.Handler) http.Handler) *testEngine {
	var h http.Handler = e
	if wrap != nil {
		h = wrap(e)
	}
	srv := httptest.NewServer(h)
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(func() {
		e.Close()
		srv.Close()
		tr.CloseIdleConnections()
	})
	return &testEngine{Engine: e, url: srv.URL, hostport: strings.TrimPrefix(srv.URL, "http://"), client: &http.Client{Transport: tr}}
}

// post sends body to path; headers come in name, value pairs.
func (te *testEngine) post(ctx context.Context, t testing.TB, path, body string, headers ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, te.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := te.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// postJSON sends body and decodes a JSON answer into v, returning the status.
func (te *testEngine) postJSON(t testing.TB, path, body string, v any, headers ...string) int {
	t.Helper()
	resp := te.post(context.Background(), t, path, body, headers...)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("content-type %q for %s", ct, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return resp.StatusCode
}

// scrape reads /metrics with the Prometheus text parser.
func (te *testEngine) scrape(t testing.TB) map[string]float64 {
	t.Helper()
	resp, err := te.client.Get(te.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			key := name
			for _, l := range m.GetLabel() {
				if l.GetName() != "model_name" {
					key += "{" + l.GetName() + "=" + l.GetValue() + "}"
				}
			}
			out[key] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return out
}

type response struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Text    string `json:"text"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage            usage           `json:"usage"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
}

type errorBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

func TestCompletionNonStreaming(t *testing.T) {
	te := startEngine(t, Options{Profile: fastProfile(), Model: "served"})
	var r response
	code := te.postJSON(t, "/v1/completions", `{"model":"asked","prompt":"hello world!","max_tokens":5}`, &r)
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	if r.Object != "text_completion" || r.Model != "asked" || len(r.Choices) != 1 || !strings.HasPrefix(r.ID, "cmpl-") {
		t.Fatalf("response %+v", r)
	}
	if r.Usage != (usage{3, 5, 8}) || r.Choices[0].FinishReason != "length" {
		t.Errorf("usage %+v finish %q, want {3 5 8} length", r.Usage, r.Choices[0].FinishReason)
	}
	if want := placeholderText(5); r.Choices[0].Text != want {
		t.Errorf("text %q, want %q", r.Choices[0].Text, want)
	}
}

func TestChatNonStreaming(t *testing.T) {
	te := startEngine(t, Options{Profile: fastProfile()})
	var r response
	body := `{"model":"m","max_completion_tokens":3,"messages":[{"role":"system","content":"You are"},` +
		`{"role":"user","content":[{"type":"text","text":"abcdefgh"}]}]}`
	if code := te.postJSON(t, "/v1/chat/completions", body, &r); code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	if r.Object != "chat.completion" || len(r.Choices) != 1 || r.Choices[0].Message.Role != "assistant" ||
		!strings.HasPrefix(r.ID, "chatcmpl-") {
		t.Fatalf("response %+v", r)
	}
	if r.Usage != (usage{12, 3, 15}) || r.Choices[0].Message.Content != placeholderText(3) {
		t.Errorf("usage %+v content %q", r.Usage, r.Choices[0].Message.Content)
	}
}

func TestDrawnOutputLength(t *testing.T) {
	lengths := func(seed int64) []int {
		te := startEngine(t, Options{Profile: fastProfile(), Seed: seed, DefaultOutputTokens: 8})
		var out []int
		for range 8 {
			var r response
			if code := te.postJSON(t, "/v1/completions", `{"model":"m","prompt":"abcd"}`, &r); code != http.StatusOK {
				t.Fatalf("status %d", code)
			}
			if r.Choices[0].FinishReason != "stop" || r.Usage.CompletionTokens < 1 || r.Usage.CompletionTokens > 32 {
				t.Fatalf("drawn length: %+v", r)
			}
			out = append(out, r.Usage.CompletionTokens)
		}
		return out
	}
	a, b, c := lengths(5), lengths(5), lengths(6)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("seed 5 drew %v then %v", a, b)
	}
	if fmt.Sprint(a) == fmt.Sprint(c) {
		t.Errorf("seeds 5 and 6 both drew %v", a)
	}
}

// sse is a parsed event stream.
type sse struct {
	tokens []string // text of each token frame
	object string
	finish string
	usage  *usage
	done   bool // [DONE] was the last event
}

func readSSE(t testing.TB, r io.Reader) sse {
	t.Helper()
	var s sse
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("line %q is not an SSE data line", line)
		}
		if s.done {
			t.Fatalf("event %q after [DONE]", line)
		}
		if data == "[DONE]" {
			s.done = true
			continue
		}
		var c struct {
			Object  string `json:"object"`
			Choices []struct {
				Text  *string `json:"text"`
				Delta *struct {
					Content *string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		if s.usage != nil {
			t.Fatalf("event %q after the usage event", data)
		}
		if s.object == "" {
			s.object = c.Object
		} else if c.Object != s.object {
			t.Fatalf("object %q then %q", s.object, c.Object)
		}
		if len(c.Choices) != 1 {
			t.Fatalf("event %q: want one choice", data)
		}
		ch := c.Choices[0]
		if ch.FinishReason != nil {
			s.finish, s.usage = *ch.FinishReason, c.Usage
			continue
		}
		switch {
		case ch.Text != nil:
			s.tokens = append(s.tokens, *ch.Text)
		case ch.Delta != nil && ch.Delta.Content != nil:
			s.tokens = append(s.tokens, *ch.Delta.Content)
		default:
			t.Fatalf("event %q carries no token", data)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestStreaming(t *testing.T) {
	te := startEngine(t, Options{Profile: fastProfile()})
	tests := []struct {
		path, body, object string
		prompt             int
	}{
		{"/v1/completions", `{"model":"m","prompt":"hello world!","max_tokens":7,"stream":true}`, "text_completion", 3},
		{"/v1/chat/completions", `{"model":"m","max_tokens":7,"stream":true,"messages":[{"role":"user","content":"abcd"}]}`, "chat.completion.chunk", 5},
	}
	for _, tt := range tests {
		t.Run(tt.object, func(t *testing.T) {
			resp := te.post(context.Background(), t, tt.path, tt.body)
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("status %d content-type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			s := readSSE(t, resp.Body)
			if len(s.tokens) != 7 || strings.Join(s.tokens, "") != placeholderText(7) {
				t.Errorf("tokens %q, want 7", s.tokens)
			}
			if s.object != tt.object || s.finish != "length" || !s.done {
				t.Errorf("object %q finish %q done %v", s.object, s.finish, s.done)
			}
			if s.usage == nil || *s.usage != (usage{tt.prompt, 7, tt.prompt + 7}) {
				t.Errorf("usage %+v", s.usage)
			}
		})
	}
}

func TestSingleTokenStream(t *testing.T) {
	te := startEngine(t, Options{Profile: fastProfile()})
	resp := te.post(context.Background(), t, "/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":1,"stream":true}`)
	defer resp.Body.Close()
	s := readSSE(t, resp.Body)
	if len(s.tokens) != 1 || s.usage == nil || *s.usage != (usage{3, 1, 4}) || !s.done {
		t.Errorf("stream %+v", s)
	}
}

func TestBadRequests(t *testing.T) {
	te := startEngine(t, Options{Profile: fastProfile()})
	tests := []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"bad json", "POST", "/v1/completions", `{"model":`, 400, "invalid_request"},
		{"missing model", "POST", "/v1/completions", `{"prompt":"x"}`, 400, "invalid_request"},
		{"missing prompt", "POST", "/v1/completions", `{"model":"m"}`, 400, "invalid_request"},
		{"missing messages", "POST", "/v1/chat/completions", `{"model":"m","prompt":"x"}`, 400, "invalid_request"},
		{"zero max_tokens", "POST", "/v1/completions", `{"model":"m","prompt":"x","max_tokens":0}`, 400, "invalid_request"},
		{"over max_kv_tokens", "POST", "/v1/completions", `{"model":"m","prompt":"x","max_tokens":2000000}`, 400, "context_length_exceeded"},
		{"GET completions", "GET", "/v1/completions", "", 405, "method_not_allowed"},
		{"POST health", "POST", "/health", "{}", 405, "method_not_allowed"},
		{"unknown path", "GET", "/v2/nothing", "", 404, "not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, te.url+tt.path, strings.NewReader(tt.body))
			resp, err := te.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e errorBody
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatalf("error body: %v", err)
			}
			if resp.StatusCode != tt.status || e.Error.Code != tt.code || e.Error.Message == "" || e.Error.Type == "" {
				t.Errorf("status %d body %+v, want %d %s", resp.StatusCode, e, tt.status, tt.code)
			}
		})
	}
}

func TestHealthAndModels(t *testing.T) {
	te := startEngine(t, Options{Profile: fastProfile(), Role: config.RoleDecode, Model: "llama"})
	resp, err := te.client.Get(te.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	var h struct{ Status, Role, Model string }
	_ = json.NewDecoder(resp.Body).Decode(&h)
	resp.Body.Close()
	if resp.StatusCode != 200 || h.Status != "ok" || h.Role != "decode" || h.Model != "llama" {
		t.Errorf("health %d %+v", resp.StatusCode, h)
	}
	te.Close()
	resp, err = te.client.Get(te.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("health after Close: %d, want 503", resp.StatusCode)
	}
	var e errorBody
	if code := te.postJSON(t, "/v1/completions", `{"model":"m","prompt":"x"}`, &e); code != 503 || e.Error.Code != "engine_closed" {
		t.Errorf("request after Close: %d %+v", code, e)
	}
}

func TestMetrics(t *testing.T) {
	te := startEngine(t, Options{Profile: fastProfile(), Role: config.RolePrefill, Model: "llama"})
	var r response
	te.postJSON(t, "/v1/completions", `{"model":"m","prompt":"abcdefgh","max_tokens":4}`, &r)
	m := te.scrape(t)
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"} {
		if v, ok := m[name]; !ok || v != 0 {
			t.Errorf("%s = %v (present %v), want 0 when idle", name, v, ok)
		}
	}
	want := map[string]float64{
		"vllm:prompt_tokens_total":                           2,
		"vllm:generation_tokens_total":                       4,
		"vllm:request_success_total{finished_reason=length}": 1,
		"enginesim_info{role=prefill}":                       1,
	}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %v, want %v", k, m[k], v)
		}
	}
	// The model_name label is on every vLLM series.
	resp, _ := te.client.Get(te.url + "/metrics")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(b, []byte(`vllm:num_requests_running{model_name="llama"} 0`)) {
		t.Errorf("metrics text:\n%s", b)
	}
}

func TestMaxStreamsHolds(t *testing.T) {
	p := fastProfile()
	p.Decode.BaseS = 0.002
	p.Decode.MaxStreams = 2
	te := startEngine(t, Options{Profile: p})
	rec := &lockedRecorder{}
	te.loop.setTracer(rec)

	stop := make(chan struct{})
	var maxRunning, maxWaiting int
	var polled sync.WaitGroup
	polled.Go(func() {
		for {
			sn := te.loop.snapshot()
			maxRunning, maxWaiting = max(maxRunning, sn.running), max(maxWaiting, sn.waiting)
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	})
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			resp, err := te.client.Post(te.url+"/v1/completions", "application/json",
				strings.NewReader(`{"model":"m","prompt":"x","max_tokens":20}`))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var r response
			if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != 200 || r.Usage.CompletionTokens != 20 {
				t.Errorf("status %d usage %+v err %v", resp.StatusCode, r.Usage, err)
			}
		})
	}
	wg.Wait()
	close(stop)
	polled.Wait()
	if maxRunning > 2 {
		t.Errorf("running reached %d with max_streams 2", maxRunning)
	}
	if maxWaiting == 0 {
		t.Error("never saw a waiting request with 5 requests and max_streams 2")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, s := range rec.steps {
		if s.kind == stepDecode && s.streams > 2 {
			t.Errorf("decode step %d ran %d streams", s.seq, s.streams)
		}
	}
}

// lockedRecorder is a tracer safe to read from the test goroutine.
type lockedRecorder struct {
	mu sync.Mutex
	recorder
}

func (r *lockedRecorder) step(s stepRecord) { r.mu.Lock(); r.recorder.step(s); r.mu.Unlock() }
func (r *lockedRecorder) done(j jobRecord)  { r.mu.Lock(); r.recorder.done(j); r.mu.Unlock() }

func TestClientCancelMidStream(t *testing.T) {
	p := fastProfile()
	p.Decode.BaseS = 0.005
	te := startEngine(t, Options{Profile: p})
	ctx, cancel := context.WithCancel(context.Background())
	resp := te.post(ctx, t, "/v1/chat/completions",
		`{"model":"m","max_tokens":100000,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	br := bufio.NewReader(resp.Body)
	for tokens := 0; tokens < 3; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data: ") {
			tokens++
		}
	}
	if m := te.scrape(t); m["vllm:num_requests_running"] != 1 || m["vllm:kv_cache_usage_perc"] == 0 {
		t.Fatalf("mid-stream: running %v kv %v", m["vllm:num_requests_running"], m["vllm:kv_cache_usage_perc"])
	}
	cancel()
	resp.Body.Close()
	poll.Until(t, 5*time.Second, "the batch to empty", func() bool {
		m := te.scrape(t)
		return m["vllm:num_requests_running"] == 0 && m["vllm:kv_cache_usage_perc"] == 0 && m["enginesim_requests_cancelled_total"] == 1
	})
}

func TestClientCancelWhileQueued(t *testing.T) {
	p := fastProfile()
	p.Decode.MaxStreams = 1
	te := startEngine(t, Options{Profile: p})
	// A holds the only stream.
	ctxA, cancelA := context.WithCancel(context.Background())
	respA := te.post(ctxA, t, "/v1/completions", `{"model":"m","prompt":"x","max_tokens":100000,"stream":true}`)
	// B queues behind it.
	ctxB, cancelB := context.WithCancel(context.Background())
	errB := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctxB, http.MethodPost, te.url+"/v1/completions",
			strings.NewReader(`{"model":"m","prompt":"x","max_tokens":5}`))
		resp, err := te.client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errB <- err
	}()
	poll.Until(t, 5*time.Second, "B to wait", func() bool { return te.scrape(t)["vllm:num_requests_waiting"] == 1 })
	cancelB()
	if err := <-errB; err == nil {
		t.Error("B finished although cancelled while queued")
	}
	poll.Until(t, 5*time.Second, "the queue to empty", func() bool { return te.scrape(t)["vllm:num_requests_waiting"] == 0 })
	cancelA()
	respA.Body.Close()
	poll.Until(t, 5*time.Second, "the batch to empty", func() bool { return te.scrape(t)["vllm:num_requests_running"] == 0 })
}

// capture records the bodies a handler receives.
type capture struct {
	mu     sync.Mutex
	paths  []string
	bodies []map[string]any
}

func (c *capture) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		c.mu.Lock()
		c.paths, c.bodies = append(c.paths, r.URL.Path), append(c.bodies, m)
		c.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(b))
		h.ServeHTTP(w, r)
	})
}

func TestDisaggregated(t *testing.T) {
	var seen capture
	pre := serveEngine(t, New(Options{Profile: fastProfile(), Role: config.RolePrefill}), seen.wrap)
	dec := startEngine(t, Options{Profile: fastProfile(), Role: config.RoleDecode})

	t.Run("completions", func(t *testing.T) {
		var r response
		code := dec.postJSON(t, "/v1/completions", `{"model":"m","prompt":"abcdefghijkl","max_tokens":6}`, &r,
			headerPrefiller, pre.hostport)
		if code != 200 || r.Usage != (usage{3, 6, 9}) || r.Choices[0].Text != placeholderText(6) {
			t.Fatalf("status %d response %+v", code, r)
		}
		seen.mu.Lock()
		body, path := seen.bodies[len(seen.bodies)-1], seen.paths[len(seen.paths)-1]
		seen.mu.Unlock()
		kv, _ := body["kv_transfer_params"].(map[string]any)
		if path != "/v1/completions" || body["max_tokens"] != 1.0 || body["stream"] != false || kv["do_remote_decode"] != true {
			t.Errorf("prefiller got %s %v", path, body)
		}
		pm, dm := pre.scrape(t), dec.scrape(t)
		if pm["vllm:prompt_tokens_total"] != 3 || pm["vllm:generation_tokens_total"] != 1 {
			t.Errorf("prefiller counters: prompt %v generation %v, want 3 and 1", pm["vllm:prompt_tokens_total"], pm["vllm:generation_tokens_total"])
		}
		if dm["vllm:prompt_tokens_total"] != 0 || dm["vllm:generation_tokens_total"] != 6 {
			t.Errorf("decoder counters: prompt %v generation %v, want 0 and 6", dm["vllm:prompt_tokens_total"], dm["vllm:generation_tokens_total"])
		}
	})

	t.Run("chat stream", func(t *testing.T) {
		resp := dec.post(context.Background(), t, "/v1/chat/completions",
			`{"model":"m","max_completion_tokens":4,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"abcd"}]}`,
			headerPrefiller, pre.hostport)
		defer resp.Body.Close()
		s := readSSE(t, resp.Body)
		if len(s.tokens) != 4 || s.usage == nil || *s.usage != (usage{5, 4, 9}) || !s.done {
			t.Errorf("stream %+v", s)
		}
		seen.mu.Lock()
		body, path := seen.bodies[len(seen.bodies)-1], seen.paths[len(seen.paths)-1]
		seen.mu.Unlock()
		if _, ok := body["max_completion_tokens"]; ok || path != "/v1/chat/completions" || body["max_tokens"] != 1.0 || body["stream"] != false {
			t.Errorf("prefiller got %s %v", path, body)
		}
	})

	t.Run("prefiller echoes kv_transfer_params", func(t *testing.T) {
		var r response
		pre.postJSON(t, "/v1/completions", `{"model":"m","prompt":"x","max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`, &r)
		if string(r.KVTransferParams) != `{"do_remote_decode":true}` {
			t.Errorf("kv_transfer_params echoed as %s", r.KVTransferParams)
		}
	})
}

func TestPrefillerFailures(t *testing.T) {
	dec := startEngine(t, Options{Profile: fastProfile()})
	const down = "127.0.0.1:1" // tcpmux: nothing listens there
	failing := serveEngine(t, New(Options{Profile: fastProfile()}), func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "out of memory", http.StatusInternalServerError)
		})
	})
	for name, addr := range map[string]string{"down": down, "500": failing.hostport} {
		t.Run(name, func(t *testing.T) {
			var e errorBody
			code := dec.postJSON(t, "/v1/completions", `{"model":"m","prompt":"x","max_tokens":3,"stream":true}`, &e,
				headerPrefiller, addr)
			if code != http.StatusBadGateway || !strings.Contains(e.Error.Message, addr) || e.Error.Code != "prefiller_failed" {
				t.Errorf("status %d error %+v, want 502 naming %s", code, e, addr)
			}
		})
	}
	if m := dec.scrape(t); m["vllm:num_requests_running"] != 0 || m["vllm:num_requests_waiting"] != 0 {
		t.Errorf("decoder holds requests after failed prefills: %v", m)
	}
}

func TestCloseFailsPending(t *testing.T) {
	p := fastProfile()
	p.Decode.BaseS = 0.005
	te := startEngine(t, Options{Profile: p})
	resp := te.post(context.Background(), t, "/v1/completions", `{"model":"m","prompt":"x","max_tokens":100000,"stream":true}`)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	te.Close()
	rest, _ := io.ReadAll(br)
	if !bytes.Contains(rest, []byte(`"code":"engine_closed"`)) || bytes.Contains(rest, []byte("[DONE]")) {
		t.Errorf("stream after Close ended with %q", rest[max(0, len(rest)-200):])
	}
}

// MaxModelLen: /v1/models reports it as vLLM does, a request over it is refused with vLLM's
// code, and a drawn output is shortened to fit.
func TestMaxModelLen(t *testing.T) {
	te := startEngine(t, Options{Profile: fastProfile(), Model: "m", MaxModelLen: 100})
	resp, err := te.client.Get(te.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&models); err != nil || len(models.Data) != 1 || models.Data[0].MaxModelLen != 100 {
		t.Fatalf("/v1/models: %+v %v", models, err)
	}
	resp.Body.Close()
	over := te.post(context.Background(), t, "/v1/completions", `{"model":"m","prompt":[`+strings.Repeat("1,", 90)+`1],"max_tokens":20}`)
	body, _ := io.ReadAll(over.Body)
	over.Body.Close()
	if over.StatusCode != 400 || !strings.Contains(string(body), "context_length_exceeded") {
		t.Fatalf("over the limit: %d %s", over.StatusCode, body)
	}
	drawn := te.post(context.Background(), t, "/v1/completions", `{"model":"m","prompt":[`+strings.Repeat("1,", 95)+`1]}`)
	var r struct{ Usage usage }
	if err := json.NewDecoder(drawn.Body).Decode(&r); err != nil || r.Usage.PromptTokens+r.Usage.CompletionTokens > 100 {
		t.Fatalf("a drawn output: %+v %v", r.Usage, err)
	}
	drawn.Body.Close()
}

// POST /pd_role_switch as SGLang answers it: refused unless enabled, with a bad body, while a
// request is in flight; otherwise the role /health reports changes; with RoleSwitchFail the
// switch fails and the engine is unhealthy from then on.
func TestPDRoleSwitch(t *testing.T) {
	type answer struct {
		Success                   bool
		Message, OldRole, NewRole string
	}
	ask := func(te *testEngine, body string) (int, answer) {
		var a struct {
			Success bool   `json:"success"`
			Message string `json:"message"`
			OldRole string `json:"old_role"`
			NewRole string `json:"new_role"`
		}
		code := te.postJSON(t, "/pd_role_switch", body, &a)
		return code, answer{a.Success, a.Message, a.OldRole, a.NewRole}
	}
	health := func(te *testEngine) (int, string) {
		resp, err := te.client.Get(te.url + "/health")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var h struct{ Status, Role string }
		_ = json.NewDecoder(resp.Body).Decode(&h)
		return resp.StatusCode, h.Role
	}
	off := startEngine(t, Options{Profile: fastProfile(), Role: "decode"})
	if code, a := ask(off, `{"new_role":"prefill"}`); code != 400 || a.Success || !strings.Contains(a.Message, "not enabled") {
		t.Errorf("not enabled: %d %+v", code, a)
	}
	te := startEngine(t, Options{Profile: fastProfile(), Role: "decode", RoleSwitch: true})
	if code, a := ask(te, `{"new_role":"both"}`); code != 400 || a.Success {
		t.Errorf("a bad role: %d %+v", code, a)
	}
	// A stream in flight: not idle.
	ctx, cancel := context.WithCancel(context.Background())
	resp := te.post(ctx, t, "/v1/completions", `{"model":"m","prompt":"x","max_tokens":100000,"stream":true}`)
	if code, a := ask(te, `{"new_role":"prefill"}`); code != 400 || a.Success || !strings.Contains(a.Message, "not idle: 1 requests") {
		t.Errorf("busy: %d %+v", code, a)
	}
	cancel()
	resp.Body.Close()
	te = startEngine(t, Options{Profile: fastProfile(), Role: "decode", RoleSwitch: true}) // an idle one
	if code, a := ask(te, `{"new_role":"prefill"}`); code != 200 || a != (answer{true, "switched from decode to prefill", "decode", "prefill"}) {
		t.Errorf("idle: %d %+v", code, a)
	}
	if code, role := health(te); code != 200 || role != "prefill" {
		t.Errorf("/health after the switch: %d %s", code, role)
	}
	bad := startEngine(t, Options{Profile: fastProfile(), Role: "prefill", RoleSwitchFail: true, RoleSwitch: true})
	if code, a := ask(bad, `{"new_role":"decode"}`); code != 500 || a.Success || a.NewRole != "prefill" {
		t.Errorf("a failing rebuild: %d %+v", code, a)
	}
	if code, role := health(bad); code != 503 || role != "prefill" {
		t.Errorf("/health after a failed switch: %d %s", code, role)
	}
	if n := bad.sw.failed.Load() + te.sw.ok.Load(); n != 2 {
		t.Errorf("switch counters: %d", n)
	}
}
