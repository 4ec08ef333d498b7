package gateway_test

import (
	"bytes"
	"context"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/extproc/envoytest"
	"github.com/narwhal-llm/narwhal/gateway"
)

// BenchmarkNullRoundTrip measures the floor cost of the ext_proc protocol:
// one stream per request, request headers and a 2 KiB BUFFERED body, each
// answered by the null server, then the stream closed, at concurrency 1 and
// 64 (one shared connection, as Envoy's ext_proc cluster).
func BenchmarkNullRoundTrip(b *testing.B) {
	addr, _ := envoytest.StartNullServer(b)
	c := envoytest.NewTestClient(b, addr, gateway.Mode{RequestBody: gateway.Buffered, MessageTimeout: 10 * time.Second})
	body := bytes.Repeat([]byte("x"), 2048)
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	hdrs := gateway.NewRequestHeaders(http.MethodPost, "/v1/completions", "gateway.test", h)

	roundTrip := func(b *testing.B) time.Duration {
		start := time.Now()
		x := c.NewExchange(context.Background())
		res, err := x.ProcessRequest(gateway.Request{Headers: hdrs, Body: bytes.NewReader(body)})
		x.Close()
		if err != nil || res.LocalReply != nil || len(res.Body) != len(body) {
			b.Fatalf("round trip: %v %+v", err, res.LocalReply)
		}
		return time.Since(start)
	}
	report := func(b *testing.B, lat []time.Duration) {
		slices.Sort(lat)
		q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Nanoseconds()) }
		b.ReportMetric(q(0.50), "p50-ns")
		b.ReportMetric(q(0.99), "p99-ns")
	}

	b.Run("conc=1", func(b *testing.B) {
		b.ReportAllocs()
		lat := make([]time.Duration, 0, b.N)
		for b.Loop() {
			lat = append(lat, roundTrip(b))
		}
		report(b, lat)
	})
	b.Run("conc=64", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism((64 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		var mu sync.Mutex
		var lat []time.Duration
		b.RunParallel(func(pb *testing.PB) {
			var mine []time.Duration
			for pb.Next() {
				mine = append(mine, roundTrip(b))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
		report(b, lat)
	})
}
