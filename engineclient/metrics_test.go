package engineclient

import (
	"bytes"
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The fixtures: vLLM's v1 engine with two data-parallel ranks (trimmed), SGLang's names as its
// production-metrics page shows them, and llm-d's emulator (llm-d-inference-sim v0.10.2) as
// captured after one completion.
func TestParseMetricsFixtures(t *testing.T) {
	for _, tc := range []struct {
		file string
		want Metrics
	}{
		{"vllm.metrics", Metrics{Dialect: "vllm", Running: 14, Waiting: 3, KVUsage: 0.5, HasKVUsage: true, KVCapacity: 59062 * 16,
			Finished: 430, HasFinished: true, PromptTokens: 1234560 + 6544, HasPromptTokens: true}},
		{"sglang.metrics", Metrics{Dialect: "sglang", Running: 41, Waiting: 9, KVUsage: 0.28, HasKVUsage: true, KVCapacity: 161721,
			Finished: 5120, HasFinished: true, PromptTokens: 8128902, HasPromptTokens: true}},
		{"llm-d-inference-sim.metrics", Metrics{Dialect: "vllm", HasKVUsage: true, KVCapacity: 1024 * 16,
			Finished: 1, HasFinished: true, PromptTokens: 2, HasPromptTokens: true}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			raw, err := os.ReadFile("testdata/" + tc.file)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseMetrics(bytes.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
			if ref, err := referenceMetrics(raw); err != nil || ref != got {
				t.Fatalf("the reference reading (expfmt) differs: %+v (%v)", ref, err)
			}
		})
	}
}

func TestParseMetricsRejects(t *testing.T) {
	for name, text := range map[string]string{
		"other names":     "# TYPE up gauge\nup 1\n",
		"empty":           "",
		"no value":        "vllm:num_requests_running{model_name=\"m\"}\n",
		"unclosed labels": "vllm:num_requests_running{model_name=\"m} 3\n",
		"not a number":    "vllm:num_requests_running three\n",
		"NaN only":        "vllm:num_requests_running NaN\n",
	} {
		if m, err := ParseMetrics(strings.NewReader(text)); !errors.Is(err, ErrNoMetrics) {
			t.Errorf("%s: %+v, %v; want ErrNoMetrics", name, m, err)
		}
	}
	// The older name of the usage gauge is read when the newer is absent; a line longer than the
	// reader's buffer is skipped whole, the lines after it read.
	long := "vllm:num_requests_waiting{x=\"" + strings.Repeat("y", 40<<10) + "\"} 99\n"
	m, err := ParseMetrics(strings.NewReader("vllm:gpu_cache_usage_perc 0.5\n" + long + "vllm:num_requests_running 2 1712345678000\n"))
	if err != nil || m.KVUsage != 0.5 || m.Running != 2 || m.Waiting != 0 {
		t.Fatalf("%+v %v", m, err)
	}
}

func TestScrapeMetrics(t *testing.T) {
	raw, _ := os.ReadFile("testdata/vllm.metrics")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(raw)
	}))
	defer srv.Close()
	m, err := ScrapeMetrics(context.Background(), srv.Client(), srv.URL+"/metrics")
	if err != nil || m.Running != 14 {
		t.Fatalf("%+v %v", m, err)
	}
	if _, err := ScrapeMetrics(context.Background(), srv.Client(), srv.URL+"/nothing"); !errors.Is(err, ErrNoMetrics) || !strings.Contains(err.Error(), "404") {
		t.Fatalf("a 404: %v", err)
	}
}

// FuzzParseMetrics checks the scanner against a reading of the same text through Prometheus's
// own parser (expfmt), wherever that parser accepts the text.
func FuzzParseMetrics(f *testing.F) {
	for _, name := range []string{"vllm.metrics", "sglang.metrics", "llm-d-inference-sim.metrics"} {
		raw, err := os.ReadFile("testdata/" + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	f.Add([]byte("vllm:num_requests_running{a=\"x\\\"}y\",b=\"2\"} 3 17\nvllm:cache_config_info{num_gpu_blocks=\"4\",block_size=\"x\"} 1\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		ref, rerr := referenceMetrics(raw)
		got, err := ParseMetrics(bytes.NewReader(raw))
		if rerr != nil {
			return // text Prometheus refuses: the scanner need only not fail otherwise
		}
		if (err == nil) != (rerr == nil) || !sameMetrics(got, ref) {
			t.Fatalf("scanner %+v (%v)\nexpfmt  %+v (%v)", got, err, ref, rerr)
		}
	})
}

// sameMetrics compares two readings, sums within rounding (the order of addition differs).
func sameMetrics(a, b Metrics) bool {
	near := func(x, y float64) bool { return x == y || math.Abs(x-y) <= 1e-9*max(math.Abs(x), math.Abs(y)) }
	return a.Dialect == b.Dialect && near(a.Running, b.Running) && near(a.Waiting, b.Waiting) && near(a.KVUsage, b.KVUsage) &&
		a.HasKVUsage == b.HasKVUsage && a.KVCapacity == b.KVCapacity && near(a.Finished, b.Finished) && a.HasFinished == b.HasFinished &&
		near(a.PromptTokens, b.PromptTokens) && a.HasPromptTokens == b.HasPromptTokens
}

// referenceMetrics reads the same samples through expfmt's metric families.
func referenceMetrics(raw []byte) (Metrics, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		return Metrics{}, err
	}
	var acc metricsAcc
	for name, f := range fams {
		w, ok := wantedNames[name]
		if !ok {
			continue
		}
		for _, x := range f.GetMetric() {
			v := x.GetGauge().GetValue() + x.GetCounter().GetValue() + x.GetUntyped().GetValue()
			if math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			blocks, size := -1, -1
			for _, l := range x.GetLabel() {
				switch l.GetName() {
				case "num_gpu_blocks":
					blocks = atoiRef(l.GetValue())
				case "block_size":
					size = atoiRef(l.GetValue())
				}
			}
			acc.add(w, v, blocks, size)
		}
	}
	return acc.result()
}

func atoiRef(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

func BenchmarkParseMetrics(b *testing.B) {
	raw, err := os.ReadFile("testdata/llm-d-inference-sim.metrics")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	r := bytes.NewReader(raw)
	for b.Loop() {
		r.Reset(raw)
		if _, err := ParseMetrics(r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseMetricsExpfmt is the same reading through Prometheus's parser (the reference
// of FuzzParseMetrics), for the ratio docs/benchmarks.md gives.
func BenchmarkParseMetricsExpfmt(b *testing.B) {
	raw, err := os.ReadFile("testdata/llm-d-inference-sim.metrics")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := referenceMetrics(raw); err != nil {
			b.Fatal(err)
		}
	}
}
