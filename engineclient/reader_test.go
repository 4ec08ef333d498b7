package engineclient

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// recorder is an Observer that keeps the last observation of each engine and answers with
// what the test sets.
type recorder struct {
	mu     sync.Mutex
	last   map[string]*router.Observation
	answer map[string]router.Observed
}

func (r *recorder) Observe(id string, o *router.Observation) (router.Observed, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last[id] = o
	return r.answer[id], true
}

func (r *recorder) get(id string) (*router.Observation, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o, ok := r.last[id]
	return o, ok
}

// syncBuffer is a log buffer the readers write from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) count(sub string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Count(s.b.String(), sub)
}

// readsCounted is narwhal_engine_metrics_reads_total{result} as reg gathers it.
func readsCounted(t *testing.T, reg *prometheus.Registry, result string) float64 {
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "narwhal_engine_metrics_reads_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetLabel()[0].GetValue() == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no reads counted with result %s", result)
	return 0
}

func TestMetricsReader(t *testing.T) {
	vllm, err := os.ReadFile("testdata/vllm.metrics")
	if err != nil {
		t.Fatal(err)
	}
	sim, err := os.ReadFile("testdata/llm-d-inference-sim.metrics") // a KV cache of 16,384 tokens
	if err != nil {
		t.Fatal(err)
	}
	var broken atomic.Bool
	broken.Store(true)
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(vllm) }))
	defer good.Close()
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if broken.Load() {
			http.Error(w, "engine core gone", http.StatusInternalServerError)
			return
		}
		_, _ = w.Write(sim)
	}))
	defer flaky.Close()

	cfg := config.Default()
	cfg.Engines = []config.Engine{
		{ID: "p1", Address: strings.TrimPrefix(good.URL, "http://"), Role: "prefill", Profile: config.DefaultProfileName},
		{ID: "d1", Address: strings.TrimPrefix(flaky.URL, "http://"), Role: "decode", Profile: config.DefaultProfileName},
	}
	f, err := fleet.New(cfg, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{last: map[string]*router.Observation{}, answer: map[string]router.Observed{"p1": {UnservedLegs: 9}}}
	var logs syncBuffer
	reg := prometheus.NewRegistry()
	m := NewMetricsReader(cfg, f, rec, slog.New(slog.NewTextHandler(&logs, nil)), reg)

	for range 2 {
		m.Pass(context.Background())
	}
	o, _ := rec.get("p1")
	if o == nil || o.Running != 14 || o.Waiting != 3 || !o.HasKVUsage || o.KVUsage != 0.5 || o.Finished != 430 {
		t.Fatalf("p1's observation: %+v", o)
	}
	if o, seen := rec.get("d1"); !seen || o != nil {
		t.Fatalf("d1's metrics fail: want a nil observation, got %+v (seen %t)", o, seen)
	}
	// Each is said once, however many passes: the failure, the prefill engine whose legs go
	// unserved. p1's KV cache (59,062 blocks of 16) is its profile's max_kv_tokens (945,000)
	// within rounding: nothing to say.
	for sub, want := range map[string]int{
		"engine metrics: cannot read them": 1, "engine=d1": 1, "not what its profile says": 0,
		"handoff check: this prefill engine's finished count does not grow": 1,
	} {
		if got := logs.count(sub); got != want {
			t.Errorf("%q logged %d times, want %d:\n%s", sub, got, want, logs.b.String())
		}
	}
	if ok, bad := readsCounted(t, reg, "ok"), readsCounted(t, reg, "error"); ok != 2 || bad != 2 {
		t.Fatalf("reads ok=%g error=%g, want 2 and 2", ok, bad)
	}

	// d1 answers again, with a KV cache far smaller than its profile's (said once); p1's legs are
	// served again.
	broken.Store(false)
	rec.mu.Lock()
	rec.answer["p1"] = router.Observed{}
	rec.mu.Unlock()
	m.Pass(context.Background())
	m.Pass(context.Background())
	if o, _ := rec.get("d1"); o == nil || o.Finished != 1 {
		t.Fatalf("d1 read again: %+v", o)
	}
	for _, sub := range []string{"engine metrics: read again", "serves its legs again", "kv_cache_tokens=16384 max_kv_tokens=945000"} {
		if logs.count(sub) != 1 {
			t.Errorf("%q not logged once:\n%s", sub, logs.b.String())
		}
	}

	// An engine out of placement is not read, and its last reading is cleared (once); a
	// stopped reader reads nothing.
	if _, err := f.Drain("d1", time.Now(), "test", fleet.Floors{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	m.Pass(ctx)
	if o, seen := rec.get("d1"); !seen || o != nil {
		t.Fatalf("a draining engine's reading not cleared: %+v (seen %t)", o, seen)
	}
	rec.mu.Lock()
	delete(rec.last, "d1")
	rec.mu.Unlock()
	m.Pass(ctx)
	if _, seen := rec.get("d1"); seen {
		t.Fatal("a draining engine was read, or cleared again")
	}
}
