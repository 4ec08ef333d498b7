package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/extproc/envoytest"
	"github.com/narwhal-llm/narwhal/gateway"
	"github.com/narwhal-llm/narwhal/internal/poll"
)

// rssBytes reads a process's resident set size from /proc.
func rssBytes(tb testing.TB, pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb * 1024
		}
	}
	tb.Fatal("no VmRSS")
	return 0
}

// BenchmarkServeMemory measures the resident memory of a real narwhal serve process that holds
// 50,000 requests in flight (placed, their ext_proc streams open awaiting the response) and
// 10,000 waiting (their body replies held), over 8 HTTP/2 connections as Envoy would open. The
// client runs in the benchmark process; only the server's RSS is counted.
func BenchmarkServeMemory(b *testing.B) {
	const inFlight, waiting, conns = 50000, 10000, 8
	for i := 0; i < b.N; i++ {
		_, engines := startEngines(b, "prefill", "decode")
		cfg := fmt.Sprintf(`listen: {admin: %q, extproc: %q, xds: %q}
router: {waiting_set: {capacity: %d, max_wait_s: 600}, first_token_timeout_s: 3600}
profiles:
  big:
    prefill: {base_s: 0.0165, per_token_s: 1.52e-5, per_token2_s: 4.21e-10, max_tokens: 16384}
    prefill_concurrency: %d
    decode: {base_s: 0.0045, per_stream_s: 2.8e-5, per_kv_token_s: 3.08e-8, max_streams: %d, max_kv_tokens: 1000000000}
engines:
  - {id: p, address: %q, role: prefill, profile: big}
  - {id: d, address: %q, role: decode, profile: big}
`, anyPort, anyPort, anyPort, waiting, inFlight, inFlight, engines[0], engines[1])
		if gc := os.Getenv("NARWHAL_BENCH_GOGC"); gc != "" {
			b.Setenv("GOGC", gc)
		}
		srv := start(b, "serve", "--config", writeConfig(b, cfg))
		admin, extprocAddr, _ := srv.serving(b)
		waitFor(b, admin, 10*time.Second, "serve up", func(s stateView) bool { return len(s.Engines) == 2 })
		base := rssBytes(b, srv.cmd.Process.Pid)

		body := []byte(`{"model":"m","prompt":"` + strings.Repeat("word ", 400) + `","max_tokens":128,"stream":true}`)
		h := http.Header{}
		h.Set("Content-Type", "application/json")
		hdrs := gateway.NewRequestHeaders(http.MethodPost, "/v1/completions", "gw", h)
		mode := gateway.Mode{RequestBody: gateway.Buffered, ResponseBody: gateway.Streamed, MessageTimeout: 10 * time.Minute}
		clients := make([]*gateway.Client, conns)
		for c := range clients {
			clients[c] = envoytest.NewTestClient(b, extprocAddr, mode)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var placed, held atomic.Int64
		var wg sync.WaitGroup
		sem := make(chan struct{}, 256)
		run := func(n int, count *atomic.Int64) {
			for k := 0; k < n; k++ {
				sem <- struct{}{}
				wg.Go(func() {
					x := clients[k%conns].NewExchange(ctx)
					defer x.Close()
					count.Add(1)
					<-sem
					if res, err := x.ProcessRequest(gateway.Request{Headers: hdrs, Body: bytes.NewReader(body)}); err == nil && res.LocalReply == nil {
						<-ctx.Done() // hold the placed request open
					}
				})
			}
		}
		run(inFlight, &placed)
		poll.Until(b, 5*time.Minute, fmt.Sprintf("%d in flight", inFlight), func() bool { return getInt(b, admin, "prefilling") >= inFlight })
		mid := rssBytes(b, srv.cmd.Process.Pid)
		run(waiting, &held)
		poll.Until(b, 5*time.Minute, fmt.Sprintf("%d waiting", waiting), func() bool { return getInt(b, admin, "waiting") >= waiting })
		end := rssBytes(b, srv.cmd.Process.Pid)
		m := goMetrics(b, admin)
		b.ReportMetric(m["go_memstats_heap_inuse_bytes"]/(inFlight+waiting), "heap-B/req")
		b.ReportMetric(m["go_memstats_stack_inuse_bytes"]/(inFlight+waiting), "stack-B/req")
		b.ReportMetric(m["go_goroutines"], "goroutines")
		b.ReportMetric((mid-base)/inFlight, "B/in-flight")
		b.ReportMetric((end-mid)/waiting, "B/waiting")
		b.ReportMetric((end-base)/(1<<20), "MiB-held")
		b.ReportMetric(end/(1<<20), "MiB-rss")
		cancel()
		wg.Wait()
		srv.stop(b)
	}
}

// getInt reads one retained gauge from /narwhal/state.
func getInt(tb testing.TB, admin, key string) int {
	resp, err := http.Get("http://" + admin + "/narwhal/state")
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct{ Retained map[string]float64 }
	if err := jsonDecode(resp.Body, &st); err != nil {
		tb.Fatal(err)
	}
	return int(st.Retained[key])
}

// goMetrics reads the Go runtime gauges of a narwhal's /metrics.
func goMetrics(tb testing.TB, admin string) map[string]float64 {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	out := map[string]float64{}
	for _, line := range strings.Split(buf.String(), "\n") {
		if f := strings.Fields(line); len(f) == 2 && strings.HasPrefix(f[0], "go_") {
			v, _ := strconv.ParseFloat(f[1], 64)
			out[f[0]] = v
		}
	}
	return out
}
