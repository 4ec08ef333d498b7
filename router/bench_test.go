package router

import (
	"fmt"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

// benchRouter builds a router over n engines, half prefill and half decode.
func benchRouter(b *testing.B, n int) *Router {
	b.Helper()
	cfg := config.Default()
	cfg.Router.WaitingSet.Capacity = 1 << 20
	cfg.Router.WaitingSet.MaxWaitS = 1e9
	for i := 0; i < n; i++ {
		role := "prefill"
		if i%2 == 1 {
			role = "decode"
		}
		cfg.Engines = append(cfg.Engines, config.Engine{ID: fmt.Sprintf("e%d", i), Address: fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250), Role: role, Profile: config.DefaultProfileName})
	}
	f, err := fleet.New(cfg, epoch)
	if err != nil {
		b.Fatal(err)
	}
	return New(cfg, f.Snapshot(), epoch)
}

// BenchmarkPlace measures the router's cost for one request. "idle": an offer on an idle fleet
// is placed at once; the op is Offer + FirstToken + Complete (the whole life of a request in
// the router). "waiting=1000": 1,000 offers already wait behind full prefill engines; the op is
// the admission and tail projection of one more offer, and its cancel.
func BenchmarkPlace(b *testing.B) {
	prefix := []uint64{11, 12, 13, 14, 15, 16, 17, 18}
	for _, n := range []int{8, 64, 1024} {
		b.Run(fmt.Sprintf("engines=%d/idle", n), func(b *testing.B) {
			r := benchRouter(b, n)
			now := epoch
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				now = now.Add(time.Millisecond)
				o := r.Offer(now, Offer{ID: "r", PromptTokens: 1024, MaxTokens: 128, Prefix: prefix})
				if o.Status != Dispatched {
					b.Fatalf("not placed: %+v", o)
				}
				_ = r.FirstToken(now, o.Handle)
				_ = r.Complete(now, o.Handle, 128)
				if i%1024 == 0 {
					r.Tick(now) // tidy finished handles as the live wrapper does
				}
			}
		})
		b.Run(fmt.Sprintf("engines=%d/waiting=1000", n), func(b *testing.B) {
			r := benchRouter(b, n)
			now := epoch
			for r.nWaiting < 1000 {
				r.Offer(now, Offer{ID: "w", PromptTokens: 1024, MaxTokens: 128})
			}
			r.Ready()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				o := r.Offer(now, Offer{ID: "r", PromptTokens: 1024, MaxTokens: 128, Prefix: prefix})
				if o.Status != Waiting {
					b.Fatalf("not waiting: %+v", o)
				}
				_ = r.Cancel(now, o.Handle)
				if i%1024 == 0 {
					r.Tick(now) // tidy stale handles as the live wrapper would
				}
			}
		})
	}
}
