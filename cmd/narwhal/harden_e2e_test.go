package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/narwhal-llm/narwhal/extproc"
	"github.com/narwhal-llm/narwhal/extproc/envoytest"
	"github.com/narwhal-llm/narwhal/gateway"
	"github.com/narwhal-llm/narwhal/internal/poll"
)

// TestShutdownAnswersWaiting (issue 7, finding 7): SIGTERM with 200 requests waiting. Readiness
// drops at once; when shutdown_grace_s runs out, every request still waiting is answered 503
// shutting_down with retry-after before the server stops, while the placed request keeps its
// stream until the grace ends. Before, all 200 got a broken transport (a 500 from Envoy).
func TestShutdownAnswersWaiting(t *testing.T) {
	const waiting = 200
	_, engines := startEngines(t, "prefill", "decode")
	cfg := fmt.Sprintf(`listen: {admin: %q, extproc: %q, xds: %q}
router: {waiting_set: {capacity: 1000, max_wait_s: 120}, first_token_timeout_s: 120, local_prefill: off}
shutdown_grace_s: 1
profiles:
  one:
    prefill: {base_s: 0.0165, per_token_s: 1.52e-5, per_token2_s: 4.21e-10, max_tokens: 16384}
    prefill_concurrency: 1
    decode: {base_s: 0.0045, per_stream_s: 2.8e-5, per_kv_token_s: 3.08e-8, max_streams: 256, max_kv_tokens: 945000}
engines:
  - {id: p, address: %q, role: prefill, profile: one}
  - {id: d, address: %q, role: decode, profile: one}
`, anyPort, anyPort, anyPort, engines[0], engines[1])
	srv := start(t, "serve", "--config", writeConfig(t, cfg))
	admin, extprocAddr, _ := srv.serving(t)
	waitFor(t, admin, 10*time.Second, "serve up", allActive(2))

	mode := gateway.Mode{RequestBody: gateway.Buffered, ResponseBody: gateway.Streamed, MessageTimeout: time.Minute}
	client := envoytest.NewTestClient(t, extprocAddr, mode)
	hdrs := gateway.NewRequestHeaders(http.MethodPost, "/v1/completions", "gw", http.Header{"Content-Type": {"application/json"}})
	body := `{"model":"m","prompt":"hello","max_tokens":4,"stream":true}`
	// One placed request holds the only prefill slot (its response never comes) ...
	first := client.NewExchange(context.Background())
	defer first.Close()
	if res, err := first.ProcessRequest(gateway.Request{Headers: hdrs, Body: strings.NewReader(body)}); err != nil || res.LocalReply != nil {
		t.Fatalf("first: %+v %v", res, err)
	}
	// ... so that the next 200 wait.
	results := make(chan *gateway.LocalReply, waiting)
	var wg sync.WaitGroup
	for range waiting {
		wg.Go(func() {
			x := client.NewExchange(context.Background())
			defer x.Close()
			res, err := x.ProcessRequest(gateway.Request{Headers: hdrs, Body: strings.NewReader(body)})
			if err != nil {
				results <- &gateway.LocalReply{Status: -1, Details: err.Error()}
				return
			}
			results <- res.LocalReply
		})
	}
	if !poll.Within(20*time.Second, func() bool { return getInt(t, admin, "waiting") >= waiting }) {
		t.Fatalf("only %d waiting", getInt(t, admin, "waiting"))
	}
	code, took := srv.stop(t)
	wg.Wait()
	close(results)
	n := 0
	for lr := range results {
		if lr == nil || lr.Status != 503 || lr.Headers.Get("retry-after") != "1" || !strings.Contains(string(lr.Body), `"code":"shutting_down"`) {
			t.Fatalf("a waiting request at shutdown got %+v", lr)
		}
		n++
	}
	if n != waiting || code != 0 || took < 900*time.Millisecond {
		t.Fatalf("%d answered, exit %d after %v (grace 1 s)", n, code, took)
	}
	if out := srv.out.String(); strings.Contains(out, "left without an answer") {
		t.Fatalf("requests left unanswered:\n%s", out)
	}
}

// TestMemoryBoundNonReadingClients (issue 7, finding 4): 200 full-duplex streams whose client
// sends body chunks as fast as flow control allows and never reads a reply. Fixed flow-control
// windows make the server buffer at most docs/memory.md's per-stream bound: the server's RSS
// grows by less than 200 times it. Before, gRPC's auto-tuned windows let each stream buffer up
// to 16 MiB (3 GB for 200 streams).
func TestMemoryBoundNonReadingClients(t *testing.T) {
	const streams = 200
	const chunk = 16 << 10
	_, engines := startEngines(t, "prefill", "decode")
	cfg := fmt.Sprintf(`listen: {admin: %q, extproc: %q, xds: %q}
engines:
  - {id: p, address: %q, role: prefill}
  - {id: d, address: %q, role: decode}
`, anyPort, anyPort, anyPort, engines[0], engines[1])
	srv := start(t, "serve", "--config", writeConfig(t, cfg))
	admin, extprocAddr, _ := srv.serving(t)
	waitFor(t, admin, 10*time.Second, "serve up", allActive(2))
	base, baseHeap := rssBytes(t, srv.cmd.Process.Pid), goMetrics(t, admin)["go_memstats_heap_inuse_bytes"]

	// The client's own windows are fixed and small, as an adversary's would be: once its
	// 64 KiB per stream are full, the server's replies block.
	conn, err := grpc.NewClient(extprocAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sent atomic.Int64
	var wg sync.WaitGroup
	payload := make([]byte, chunk)
	for range streams {
		ps, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			headers := &extprocv3.ProcessingRequest{
				Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
					{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/upload")}}}}},
				ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
					ResponseBodyMode: extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
			}
			if ps.Send(headers) != nil {
				return
			}
			for range (64 << 20) / chunk { // at most 64 MiB each: far beyond any window
				if ps.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: payload}}}) != nil {
					return
				}
				sent.Add(chunk)
			}
		})
	}
	// Flow control stops every sender: wait until nothing moves for a while.
	last, still := int64(-1), 0
	for deadline := time.Now().Add(60 * time.Second); still < 5; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the senders never stalled: %d MiB sent", sent.Load()>>20)
		}
		if n := sent.Load(); n == last {
			still++
		} else {
			last, still = n, 0
		}
	}
	grown := rssBytes(t, srv.cmd.Process.Pid) - base
	heap := goMetrics(t, admin)["go_memstats_heap_inuse_bytes"] - baseHeap
	live := float64(streams) * float64(perStreamBound(chunk))
	bound := gcHeadroom * live
	t.Logf("%d streams: %.1f MiB sent; server heap in use grew %.1f MiB, RSS %.1f MiB (live bound %.1f MiB, RSS bound %.1f MiB)",
		streams, float64(sent.Load())/(1<<20), heap/(1<<20), grown/(1<<20), live/(1<<20), bound/(1<<20))
	if grown > bound {
		t.Fatalf("server RSS grew %.1f MiB with %d non-reading streams, over the bound %.1f MiB", grown/(1<<20), streams, bound/(1<<20))
	}
	cancel()
	wg.Wait()

	// The streams are gone; the server still serves.
	var st struct{ Counters struct{ Offers int } }
	resp, err := http.Get("http://" + admin + "/narwhal/state")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
}

// gcHeadroom: with GOGC=100 the Go heap may reach twice its live size before a collection.
const gcHeadroom = 2

// perStreamBound is docs/memory.md's bound on what one stream that never reads makes the
// server hold, for messages of chunk bytes: its unread receive window, the message being
// decoded and the reply being sent, grpc-go's write quota of queued replies (64 KiB) twice —
// the replies' encoded bytes and the request bodies they echo —, and the stream's own state
// (goroutine stack and transport).
func perStreamBound(chunk int) int {
	const writeQuota, streamState = 64 << 10, 32 << 10
	return extproc.StreamWindow + 2*chunk + 2*writeQuota + streamState
}
