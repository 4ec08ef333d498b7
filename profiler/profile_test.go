package profiler

import (
	"bytes"
	"context"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/enginesim"
	"github.com/narwhal-llm/narwhal/internal/simtest"
)

// serveEngine runs an enginesim engine with the true profile prof and returns its URL.
func serveEngine(t testing.TB, prof config.Profile, maxModelLen int) string {
	t.Helper()
	return "http://" + simtest.Serve(t, enginesim.Options{Profile: prof, Model: "m", Role: "decode", MaxModelLen: maxModelLen})
}

// other is a profile unlike the default: a slower, more quadratic prefill, a decode dearer per
// stream and per KV token, and small limits.
func other() config.Profile {
	return config.Profile{
		Prefill:            &config.PrefillCurve{BaseS: 0.025, PerTokenS: 3e-5, PerToken2S: 2e-9, MaxTokens: 8192},
		PrefillConcurrency: 4,
		Decode:             &config.DecodeCurve{BaseS: 0.008, PerStreamS: 1.5e-4, PerKVTokenS: 8e-8, MaxStreams: 48, MaxKVTokens: 150000},
		KVTransferS:        0.02,
	}
}

// chunked is the default profile with chunked prefill at budget tokens a step.
func chunked(budget int) config.Profile {
	p := config.DefaultProfile()
	p.ChunkedPrefill.BudgetTokens = budget
	return p
}

func maxStreams(d []DecodePoint) (n int) {
	for _, p := range d {
		n = max(n, p.Streams)
	}
	return n
}

// within checks that got is within tol (relative) of want.
func within(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want) > tol*want {
		t.Errorf("%s: fitted %.6g, true %.6g (%.1f%%, want within %.0f%%)", what, got, want, 100*(got-want)/want, 100*tol)
	}
}

// Issue 12: profiled against enginesim engines of known profiles — the default and one with other
// coefficients and limits — the fitted curves predict the true prefill and decode times within
// 5% over the profiled range, and the limits within 10%; the YAML block it writes validates.
//
// The 5% holds on a quiet machine: it times real servers in real time (make check-long and make
// bench-profile set NARWHAL_REALTIME=1). Under make test the engines run late by up to ~8% (the
// race detector, and a busy core delays every timer), so there the curves are held to 15% —
// enough to catch a wrong fit — and the limits, counted not timed, to 10% still; make test runs
// this package alone, after the others (beside them the decode fit was off by 17–36%).
func TestProfileRecoversKnownProfiles(t *testing.T) {
	budget := 25 * time.Second
	if s, err := strconv.Atoi(os.Getenv("NARWHAL_PROFILE_BUDGET_S")); err == nil && s > 0 {
		budget = time.Duration(s) * time.Second
	}
	curves, handoff := 0.15, 0.5
	if os.Getenv("NARWHAL_REALTIME") != "" {
		curves, handoff = 0.05, 0.20
	}
	for _, c := range []struct {
		name        string
		prof        config.Profile
		maxModelLen int
		handoff     bool // measure kv_transfer_s through a second engine
	}{
		{"default", config.DefaultProfile(), 16384, false},
		{"other", other(), 8192, true},
		{"chunked", chunked(2048), 16384, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, err := NewEngine(serveEngine(t, c.prof, c.maxModelLen), "m")
			if err != nil {
				t.Fatal(err)
			}
			o := Options{Engine: e, Budget: budget}
			if c.handoff {
				if o.Prefiller, err = NewEngine(serveEngine(t, c.prof, c.maxModelLen), "m"); err != nil {
					t.Fatal(err)
				}
			}
			res, err := Run(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			res.WriteYAML(&out, c.name)
			t.Logf("%s\n%s", res.Elapsed, out.String())
			if res.Err != nil {
				t.Fatalf("run: %v", res.Err)
			}
			got, ok := res.Profile()
			if !ok || got.Prefill == nil || got.Decode == nil {
				t.Fatalf("no profile: %+v", got)
			}
			truth := c.prof
			if got.Prefill.MaxTokens < c.maxModelLen*9/10 {
				t.Errorf("the ladder reached %d tokens of %d", got.Prefill.MaxTokens, c.maxModelLen)
			}
			worstP, worstD, worstAt := 0.0, 0.0, 0
			for n := 32; n <= got.Prefill.MaxTokens; n = n*3/2 + 1 {
				within(t, "prefill at "+strconv.Itoa(n), got.Prefill.Seconds(n), truth.Prefill.Seconds(n), curves)
				if e := math.Abs(got.Prefill.Seconds(n)/truth.Prefill.Seconds(n) - 1); e > worstP {
					worstP, worstAt = e, n
				}
			}
			for _, d := range res.Decode { // over the measured range
				within(t, "decode step at "+strconv.Itoa(d.Streams)+" streams, "+strconv.Itoa(d.KVTokens)+" KV",
					got.Decode.StepSeconds(d.Streams, d.KVTokens), truth.Decode.StepSeconds(d.Streams, d.KVTokens), curves)
				worstD = max(worstD, math.Abs(got.Decode.StepSeconds(d.Streams, d.KVTokens)/truth.Decode.StepSeconds(d.Streams, d.KVTokens)-1))
			}
			t.Logf("prefill of %d prompts at once: %.2f of one after another", res.TogetherPrompts, res.Together)
			if res.Together == 0 {
				t.Error("no prefill of prompts at once measured")
			}
			within(t, "prefill of prompts at once against one after another (enginesim prefills one at a time)", res.Together, 1, 0.15)
			t.Logf("budget %v: prefill within %.1f%% (worst at %d) up to %d tokens, decode within %.1f%% over %d batches (up to %d streams), max_streams %d (true %d), max_kv_tokens %d (true %d), kv_transfer_s %.4g (true %.4g)",
				budget, 100*worstP, worstAt, got.Prefill.MaxTokens, 100*worstD, len(res.Decode), maxStreams(res.Decode), got.Decode.MaxStreams, truth.Decode.MaxStreams,
				got.Decode.MaxKVTokens, truth.Decode.MaxKVTokens, got.KVTransferS, truth.KVTransferS)
			t.Logf("chunked prefill: %d steps widened, budget %d (true %d)", res.ChunkSteps, got.ChunkedPrefill.BudgetTokens, truth.ChunkedPrefill.BudgetTokens)
			if want := truth.ChunkedPrefill.BudgetTokens; want == 0 && (!res.ChunkMeasured || got.ChunkedPrefill.BudgetTokens != 0) {
				t.Errorf("an unchunked engine measured %d steps widened, budget %d", res.ChunkSteps, got.ChunkedPrefill.BudgetTokens)
			} else if want > 0 {
				within(t, "chunked_prefill.budget_tokens", float64(got.ChunkedPrefill.BudgetTokens), float64(want), 0.10)
			}
			within(t, "max_streams", float64(got.Decode.MaxStreams), float64(truth.Decode.MaxStreams), 0.10)
			within(t, "max_kv_tokens", float64(got.Decode.MaxKVTokens), float64(truth.Decode.MaxKVTokens), 0.10)
			if c.handoff {
				if len(res.KVTransfer) == 0 {
					t.Error("no handoff measured")
				}
				within(t, "kv_transfer_s", got.KVTransferS, truth.KVTransferS, handoff) // two engines and a hop
			}
			cfg, err := config.Load([]byte(out.String() + "engines:\n- {id: e1, address: \"127.0.0.1:1\", role: prefill, profile: " + c.name +
				"}\n- {id: e2, address: \"127.0.0.1:2\", role: decode, profile: " + c.name + "}\n"))
			if err != nil {
				t.Fatalf("the written block does not validate: %v", err)
			}
			if cfg.Profiles[c.name].Decode == nil {
				t.Fatal("the written block lost its decode curve")
			}
		})
	}
}

// Bad input: an unreachable URL, a server that is not OpenAI-compatible, a model the engine does
// not serve — each a clear error, before anything is measured.
func TestProfileRefusesWhatItCannotMeasure(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	notAI := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "<html>welcome to nginx</html>", http.StatusNotFound)
	}))
	defer notAI.Close()
	live := serveEngine(t, config.DefaultProfile(), 0)
	for _, c := range []struct{ url, model, want string }{
		{dead, "m", "connection refused"},
		{notAI.URL, "m", "is not an OpenAI-compatible server: GET /v1/models answered 404"},
		{live, "llama", `does not serve model "llama" (it serves m)`},
	} {
		e, err := NewEngine(c.url, c.model)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Run(context.Background(), Options{Engine: e, Budget: time.Second}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.url, err, c.want)
		}
	}
	if _, err := NewEngine("10.0.0.1:8000", "m"); err == nil {
		t.Error("a URL without a scheme was taken")
	}
}

// An engine that starts failing mid-sweep: the run ends with the error, what was measured is
// kept, and the block written says it is incomplete and carries the measurements.
func TestProfileKeepsWhatItMeasured(t *testing.T) {
	eng := enginesim.New(enginesim.Options{Profile: config.DefaultProfile(), Model: "m", MaxModelLen: 16384})
	defer eng.Close()
	var mu sync.Mutex
	completions := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/completions" {
			mu.Lock()
			completions++
			n := completions
			mu.Unlock()
			if n > 20 {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = w.Write([]byte(`{"error":{"message":"CUDA error: an illegal memory access","type":"server_error","code":"internal"}}`))
				return
			}
		}
		eng.ServeHTTP(w, r)
	}))
	defer srv.Close()
	e, err := NewEngine(srv.URL, "m")
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), Options{Engine: e, Budget: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Err == nil || !strings.Contains(res.Err.Error(), "prefill at") || !strings.Contains(res.Err.Error(), "answered 500 internal: CUDA error") {
		t.Fatalf("the run's error: %v", res.Err)
	}
	if len(res.Prefill) != 18 || res.PrefillFit == nil { // 20 completions less the two that size prompts
		t.Fatalf("kept %d prefills, fit %v", len(res.Prefill), res.PrefillFit)
	}
	var out bytes.Buffer
	if !res.WriteYAML(&out, "partial") {
		t.Fatal("nothing written from a fitted prefill curve")
	}
	s := out.String()
	for _, want := range []string{"# INCOMPLETE: prefill at", "answered 500", "prefill: {base_s:", "# measured prefills"} {
		if !strings.Contains(s, want) {
			t.Errorf("the block lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "decode: {") {
		t.Errorf("a decode curve from no decode batch:\n%s", s)
	}
}

// An engine that reports a KV cache smaller than the batches it runs without queueing (llm-d's
// emulator reports 1,024 blocks of 16 and runs far more): max_kv_tokens is what ran, a floor,
// and the profile says why. (Before, the reported 16,384 was taken unchecked, and placement
// kept streams off an engine that had room.)
func TestProfileChecksTheReportedKVCache(t *testing.T) {
	engine := serveEngine(t, config.DefaultProfile(), 16384)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, engine+r.URL.Path, r.Body)
		req.Header = r.Header.Clone()
		req.Header.Del("Accept-Encoding") // plain text, to append to
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.Header().Del("Content-Length") // /metrics grows by a line
		w.WriteHeader(resp.StatusCode)
		flush := func() {
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
		}
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			_, _ = w.Write(buf[:n])
			flush()
			if err != nil {
				break
			}
		}
		if r.URL.Path == "/metrics" {
			_, _ = io.WriteString(w, "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"8\"} 1\n")
		}
	}))
	defer proxy.Close()
	e, err := NewEngine(proxy.URL, "m")
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), Options{Engine: e, Budget: 8 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.MaxKV.Value <= 128 || res.MaxKV.Reached || !strings.Contains(res.MaxKV.How, "more than the engine's reported KV cache (128)") {
		t.Fatalf("max_kv_tokens %+v: want what ran, above the reported 128", res.MaxKV)
	}
	if !strings.Contains(strings.Join(res.Notes, "\n"), "reports a KV cache of 128 tokens") {
		t.Fatalf("no note: %q", res.Notes)
	}
}

// chunkBudget reads residents' token times around a prompt's prefill: no token while it ran is
// an unchunked engine (a late timer's gaps outside it change nothing); k widened steps are a
// chunked one (a step a late timer alone widened is told by its size); one is a lower bound.
func TestChunkBudgetFromGaps(t *testing.T) {
	at := func(ms float64) time.Time { return time.Unix(0, 0).Add(time.Duration(ms * float64(time.Millisecond))) }
	// resident: tokens every 5 ms up to 100 ms, then the given gaps (ms), then every 5 ms.
	resident := func(gaps ...float64) Trace {
		var tr Trace
		x := 0.0
		for ; x <= 100; x += 5 {
			tr.Tokens = append(tr.Tokens, at(x))
		}
		x -= 5
		for _, g := range gaps {
			x += g
			tr.Tokens = append(tr.Tokens, at(x))
		}
		for range 10 {
			x += 5
			tr.Tokens = append(tr.Tokens, at(x))
		}
		return tr
	}
	prompt := func(first float64) Trace {
		return Trace{Sent: at(101), Tokens: []time.Time{at(first)}, PromptTokens: 10000}
	}
	for _, c := range []struct {
		name          string
		gaps          []float64
		first         float64 // the prompt's first token
		budget, steps int
	}{
		{"unchunked", []float64{5, 405, 30}, 505, 0, 1},             // the batch waits one long step; a late timer after
		{"chunked", []float64{5, 45, 45, 45, 45, 25}, 310, 2223, 5}, // four full chunks and a half: 10,000/4.5 + 1
		{"chunked, a late timer in the window", []float64{12, 45, 45, 45, 45, 25}, 317, 2223, 5},
		{"chunked, the prompt's token seen a little first", []float64{5, 45, 45, 45, 45, 25}, 306, 2223, 5},
		{"one step", []float64{5, 120}, 225, 0, 1}, // a budget above the prompt reads as unchunked
	} {
		t.Run(c.name, func(t *testing.T) {
			budget, steps, ok := chunkBudget([]Trace{resident(c.gaps...)}, prompt(c.first), 0)
			if !ok || steps != c.steps || math.Abs(float64(budget-c.budget)) > float64(c.budget)/50 || (c.budget == 0) != (budget == 0) {
				t.Fatalf("budget %d in %d steps (ok %t), want %d in %d", budget, steps, ok, c.budget, c.steps)
			}
		})
	}
	if _, _, ok := chunkBudget([]Trace{resident()}, prompt(1000), 0); ok {
		t.Error("a resident that ended before the prompt's first token was read")
	}
}
