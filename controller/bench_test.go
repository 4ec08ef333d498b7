package controller

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// BenchmarkRegularPass measures one regular pass (the current split and both adjacent ones
// priced, motives, donors, gates, the record) with waiting requests behind full prefill
// engines, half the engines prefill and half decode; offers arrive 100 a second. And one
// urgent evaluation (the triggering request's projected TTFT under two splits, the gates).
func BenchmarkRegularPass(b *testing.B) {
	for _, n := range []int{8, 64, 1024} {
		for _, waiting := range []int{100, 1000, 10000} {
			b.Run(fmt.Sprintf("engines=%d/waiting=%d", n, waiting), func(b *testing.B) {
				c, fl, r, now, _ := benchFleet(b, n, waiting)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					c.nextPass = 0
					d, ok := c.Tick(now, fl, r)
					if !ok {
						b.Fatal("no pass")
					}
					c.Applied(d)
				}
			})
		}
	}
}

func BenchmarkUrgent(b *testing.B) {
	for _, n := range []int{8, 64, 1024} {
		b.Run(fmt.Sprintf("engines=%d/waiting=1000", n), func(b *testing.B) {
			c, fl, r, now, tr := benchFleet(b, n, 1000)
			c.nextPass = 1e18
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c.urgent = &pending{due: 0, tr: tr}
				d, ok := c.Tick(now, fl, r)
				if !ok || d.Caller != decisionlog.CallerUrgent || d.Outcome == decisionlog.OutcomeDropped {
					b.Fatalf("no urgent evaluation of a waiting request: %+v", d)
				}
				c.Applied(d)
			}
		})
	}
}

func benchFleet(b *testing.B, n, waiting int) (*Controller, fleet.Snapshot, *router.Router, time.Time, router.Trigger) {
	b.Helper()
	cfg := config.Default()
	cfg.Router.WaitingSet.Capacity = 1 << 20
	cfg.Router.WaitingSet.MaxWaitS = 1e9
	cfg.Controller.Advisory = true // price and gate, move nothing, so every op sees the same state
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
	r := router.New(cfg, f.Snapshot(), epoch)
	now := epoch
	var tr router.Trigger
	var out router.Output
	for i := 0; r.Snapshot(now).Retained.Waiting < waiting; i++ {
		now = now.Add(10 * time.Millisecond)
		o := r.Offer(now, router.Offer{ID: "r", PromptTokens: 512 + i%1024, MaxTokens: 64})
		if o.Status == router.Rejected {
			b.Fatalf("rejected: %+v", o)
		}
		// The urgent benchmark evaluates the latest waiting request (a large pool may project
		// every TTFT under the SLO and raise no trigger; the evaluation costs the same).
		if o.Status == router.Waiting {
			tr = router.Trigger{Request: "r", Handle: o.Handle}
		}
		r.Take(&out)
	}
	if _, waiting := r.Price(now, router.Query{Splits: []router.Split{r.CurrentSplit()}, Request: tr.Handle}); !waiting {
		b.Fatalf("the trigger %+v is not waiting", tr)
	}
	c := New(cfg, epoch)
	c.win.closed = true
	return c, f.Snapshot(), r, now, tr
}

// BenchmarkPlacementUnderEvaluations measures the p99 latency of one placement (Offer, first
// token, completion on router.Live) by 4 concurrent callers on 64 engines: alone, while a
// goroutine runs a regular pass every millisecond (5,000 times the production cadence of one
// per step_s), and back to back (the worst case) — each on a fork taken under the router's
// lock, as controller.Live does.
func BenchmarkPlacementUnderEvaluations(b *testing.B) {
	for _, every := range []time.Duration{-1, time.Millisecond, 0} {
		name := map[time.Duration]string{-1: "none", time.Millisecond: "every-1ms", 0: "back-to-back"}[every]
		evaluating := every >= 0
		b.Run("evaluations="+name, func(b *testing.B) {
			cfg := config.Default()
			cfg.Controller.Advisory = true
			for i := 0; i < 64; i++ {
				role := "prefill"
				if i%2 == 1 {
					role = "decode"
				}
				cfg.Engines = append(cfg.Engines, config.Engine{ID: fmt.Sprintf("e%d", i), Address: fmt.Sprintf("10.0.0.%d:8000", i), Role: role, Profile: config.DefaultProfileName})
			}
			f, err := fleet.New(cfg, time.Now())
			if err != nil {
				b.Fatal(err)
			}
			rl := router.NewLive(router.New(cfg, f.Snapshot(), time.Now()), time.Now, router.Hooks{})
			c := New(cfg, time.Now())
			var fork *router.Router
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				for evaluating {
					select {
					case <-stop:
						return
					default:
					}
					snap := f.Snapshot() // as Live: a fork under the lock, the pass outside it
					var now time.Time
					rl.Do(func(t time.Time, r *router.Router) { now, fork = t, r.Fork(fork) })
					c.nextPass = 0
					if d, ok := c.Tick(now, snap, fork); ok {
						c.Applied(d)
					}
					if every > 0 {
						time.Sleep(every) // the evaluation cadence, not a synchronisation
					}
				}
			}()
			const callers = 4
			lat := make([][]time.Duration, callers)
			b.ResetTimer()
			var wg sync.WaitGroup
			for k := 0; k < callers; k++ {
				wg.Go(func() {
					for i := k; i < b.N; i += callers {
						begin := time.Now()
						o, err := rl.Offer(context.Background(), router.Offer{ID: "r", PromptTokens: 1024, MaxTokens: 128})
						if err != nil || o.Status != router.Dispatched {
							b.Errorf("%+v %v", o, err)
							return
						}
						_ = rl.FirstToken(o.Handle)
						_ = rl.Complete(o.Handle, 128)
						lat[k] = append(lat[k], time.Since(begin))
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			close(stop)
			<-done
			var all []time.Duration
			for _, l := range lat {
				all = append(all, l...)
			}
			sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
			if len(all) > 0 {
				q := func(f float64) float64 { return float64(all[int(f*float64(len(all)-1))].Nanoseconds()) / 1e3 }
				b.ReportMetric(q(0.5), "p50-µs")
				b.ReportMetric(q(0.99), "p99-µs")
				b.ReportMetric(q(0.999), "p99.9-µs")
			}
		})
	}
}
