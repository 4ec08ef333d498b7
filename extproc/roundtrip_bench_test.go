package extproc_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/extproc"
	"github.com/narwhal-llm/narwhal/extproc/envoytest"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/gateway"
	"github.com/narwhal-llm/narwhal/router"
	"github.com/narwhal-llm/narwhal/tlsfiles"
	"github.com/narwhal-llm/narwhal/wire"
)

// chatBody is a realistic chat request of about size bytes.
func chatBody(size int) []byte {
	head := `{"model":"meta-llama/Llama-3.1-8B-Instruct","stream":true,"max_tokens":128,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"`
	tail := `"}]}`
	words := strings.Repeat("the quick brown fox jumps over the lazy dog ", size/44+1)
	return []byte(head + words[:size-len(head)-len(tail)] + tail)
}

// chatExchange is the request of the round-trip benchmarks: a 2 KiB chat body and its headers.
func chatExchange() (gateway.Headers, []byte) {
	body := chatBody(2048)
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	return gateway.NewRequestHeaders(http.MethodPost, "/v1/chat/completions", "gateway.test", h), body
}

// startNarwhal serves Narwhal's ext_proc server over a router of 4 idle engines (addresses
// only: placement needs no engine) with room for any concurrency.
func startNarwhal(b *testing.B, opts ...grpc.ServerOption) string {
	cfg := config.Default()
	p := cfg.Profiles[config.DefaultProfileName]
	p.PrefillConcurrency = 1 << 16
	cfg.Profiles[config.DefaultProfileName] = p
	for i, role := range []string{"prefill", "prefill", "decode", "decode"} {
		cfg.Engines = append(cfg.Engines, config.Engine{ID: fmt.Sprintf("e%d", i), Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Role: role, Profile: config.DefaultProfileName})
	}
	f, err := fleet.New(cfg, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	live := router.NewLive(router.New(cfg, f.Snapshot(), time.Now()), time.Now, router.Hooks{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = live.Run(ctx); close(done) }()
	b.Cleanup(func() { cancel(); <-done })
	sizer, err := extproc.NewSizer(cfg.Router.Sizing)
	if err != nil {
		b.Fatal(err)
	}
	srv := extproc.NewServer(extproc.Options{Router: cfg.Router, Placer: live, Sizer: sizer})
	return envoytest.StartServer(b, srv, append(extproc.GRPCServerOptions(cfg), opts...)...)
}

// BenchmarkRoundTrip measures one ext_proc exchange as Envoy drives it (request headers, then
// a 2 KiB chat body, BUFFERED or FULL_DUPLEX_STREAMED, each waiting for its reply; then the stream closes) against
// Narwhal (parse, size, place; the close releases the placement) and against a null server
// that answers every message with an empty reply, in the same run, at concurrency 1 and 64
// over one shared HTTP/2 connection. p50/p99 are per exchange.
func BenchmarkRoundTrip(b *testing.B) {
	hdrs, body := chatExchange()
	modes := []struct {
		name string
		mode gateway.Mode
	}{
		{"buffered", gateway.Mode{RequestBody: gateway.Buffered, ResponseBody: gateway.Streamed, MessageTimeout: 10 * time.Second, ReceivingNamespaces: []string{"envoy.lb"}}},
		{"duplex", gateway.Mode{RequestBody: gateway.FullDuplex, ResponseBody: gateway.FullDuplex, MessageTimeout: 10 * time.Second, ReceivingNamespaces: []string{"envoy.lb"}}},
	}

	servers := []struct {
		name  string
		start func(*testing.B) string
		check func(*testing.B, *gateway.RequestResult)
	}{
		{"null", func(b *testing.B) string { a, _ := envoytest.StartNullServer(b); return a }, func(*testing.B, *gateway.RequestResult) {}},
		{"narwhal", func(b *testing.B) string { return startNarwhal(b) }, func(b *testing.B, r *gateway.RequestResult) {
			if r.Headers.Get(wire.HeaderDestination) == "" {
				b.Fatalf("not placed: %+v", r.LocalReply)
			}
		}},
	}
	for _, m := range modes {
		for _, conc := range []int{1, 64} {
			for _, srv := range servers { // the two servers back to back: the same machine state
				b.Run(fmt.Sprintf("%s/conc=%d/%s", m.name, conc, srv.name), func(b *testing.B) {
					c := envoytest.NewTestClient(b, srv.start(b), m.mode)
					measure(b, conc, func() time.Duration { return trip(b, c, hdrs, body, srv.check) })
				})
			}
		}
	}
}

// trip runs one exchange on c and returns its duration.
func trip(b *testing.B, c *gateway.Client, hdrs gateway.Headers, body []byte, check func(*testing.B, *gateway.RequestResult)) time.Duration {
	start := time.Now()
	x := c.NewExchange(context.Background())
	res, err := x.ProcessRequest(gateway.Request{Headers: hdrs, Body: bytes.NewReader(body)})
	x.Close()
	if err != nil || res.LocalReply != nil {
		b.Fatalf("round trip: %v %+v", err, res)
	}
	check(b, res)
	return time.Since(start)
}

// measure runs b.N trips at concurrency conc (1: one after the other) and reports p50 and p99
// per trip and the rate.
func measure(b *testing.B, conc int, trip func() time.Duration) {
	var mu sync.Mutex
	var lat []time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	if conc == 1 {
		for i := 0; i < b.N; i++ {
			lat = append(lat, trip())
		}
	} else {
		b.SetParallelism((conc + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		b.RunParallel(func(pb *testing.PB) {
			var mine []time.Duration
			for pb.Next() {
				mine = append(mine, trip())
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	b.StopTimer()
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

// BenchmarkRoundTripTLS is BenchmarkRoundTrip's buffered exchange against Narwhal in plaintext
// and over mutual TLS (tls.extproc with a client CA; ECDSA P-256 certificates), back to back,
// at concurrency 1 and 64 over one shared connection: the cost TLS adds to a placement once the
// connection is up (Envoy keeps it for the life of the process, so the handshake is not in it).
func BenchmarkRoundTripTLS(b *testing.B) {
	hdrs, body := chatExchange()
	mode := gateway.Mode{RequestBody: gateway.Buffered, ResponseBody: gateway.Streamed, MessageTimeout: 10 * time.Second, ReceivingNamespaces: []string{"envoy.lb"}}
	serverTLS, clientTLS := benchPKI(b)
	placed := func(b *testing.B, r *gateway.RequestResult) {
		if r.Headers.Get(wire.HeaderDestination) == "" {
			b.Fatalf("not placed: %+v", r.LocalReply)
		}
	}
	for _, conc := range []int{1, 64} {
		for _, transport := range []string{"plaintext", "mtls"} {
			b.Run(fmt.Sprintf("conc=%d/%s", conc, transport), func(b *testing.B) {
				var c *gateway.Client
				if transport == "plaintext" {
					c = envoytest.NewTestClient(b, startNarwhal(b), mode)
				} else {
					addr := startNarwhal(b, grpc.Creds(credentials.NewTLS(serverTLS)))
					c = envoytest.NewTestClient(b, addr, mode, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
				}
				measure(b, conc, func() time.Duration { return trip(b, c, hdrs, body, placed) })
			})
		}
	}
}

// benchPKI writes a CA, a server and a client certificate and returns the two sides' configs.
func benchPKI(b *testing.B) (server, client *tls.Config) {
	dir := b.TempDir()
	ca, err := tlsfiles.NewCA("bench CA", time.Now(), time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	caFile, err := ca.WriteCA(dir, "ca")
	if err != nil {
		b.Fatal(err)
	}
	cert, key, err := ca.WriteLeaf(dir, "narwhal", tlsfiles.Leaf{Name: "narwhal", Hosts: []string{"127.0.0.1"}, Server: true})
	if err != nil {
		b.Fatal(err)
	}
	ccert, ckey, err := ca.WriteLeaf(dir, "envoy", tlsfiles.Leaf{Name: "envoy", Client: true})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := tlsfiles.NewServer("tls.extproc", tlsfiles.Files{CertFile: cert, KeyFile: key, ClientCAFile: caFile}, nil)
	if err != nil {
		b.Fatal(err)
	}
	if client, err = tlsfiles.Client("bench", caFile, ccert, ckey); err != nil {
		b.Fatal(err)
	}
	return srv.Config(), client
}
