package controller

import (
	"fmt"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
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
					if _, ok := c.Tick(now, fl, r); !ok {
						b.Fatal("no pass")
					}
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
				if d, ok := c.Tick(now, fl, r); !ok || d.Caller != CallerUrgent {
					b.Fatalf("no urgent evaluation: %+v", d)
				}
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
	for i := 0; r.Snapshot(now).Retained.Waiting < waiting; i++ {
		now = now.Add(10 * time.Millisecond)
		if o := r.Offer(now, router.Offer{ID: "r", PromptTokens: 512 + i%1024, MaxTokens: 64}); o.Status == router.Rejected {
			b.Fatalf("rejected: %+v", o)
		}
		if t, ok := r.TakeTrigger(); ok && tr.Handle == 0 {
			tr = t
		}
	}
	c := New(cfg, epoch)
	c.win.closed = true
	return c, f.Snapshot(), r, now, tr
}
