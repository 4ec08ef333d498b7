package router

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

// benchRouter builds a router over n engines, half prefill and half decode.
func benchRouter(b *testing.B, n int, tweak ...func(*config.Config)) *Router {
	b.Helper()
	cfg := config.Default()
	for _, f := range tweak {
		f(cfg)
	}
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
		// idle/local=auto: local prefill priced beside the disaggregated path
		// (router.local_prefill: auto): every decode engine is a candidate too, and an idle
		// fleet places locally.
		for _, mode := range []struct {
			name, local string
			kind        Kind
		}{{"", config.LocalPrefillOff, Disaggregated}, {"/local=auto", config.LocalPrefillAuto, Local}} {
			b.Run(fmt.Sprintf("engines=%d/idle%s", n, mode.name), func(b *testing.B) {
				r := benchRouter(b, n, func(c *config.Config) { c.Router.LocalPrefill = mode.local })
				now := epoch
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					// 10 requests a second: an idle fleet, whose decode engines' streams
					// (none) need none of their time for the output asked of them.
					now = now.Add(100 * time.Millisecond)
					o := r.Offer(now, Offer{ID: "r", PromptTokens: 1024, MaxTokens: 128, Prefix: prefix})
					if o.Status != Dispatched || o.Placement.Kind != mode.kind {
						b.Fatalf("not placed %v: %+v", mode.kind, o)
					}
					_ = r.FirstToken(now, o.Handle)
					_ = r.Complete(now, o.Handle, 128)
					if i%1024 == 0 {
						r.Tick(now) // tidy finished handles as the live wrapper does
					}
				}
			})
		}
		b.Run(fmt.Sprintf("engines=%d/waiting=1000", n), func(b *testing.B) {
			r := benchRouter(b, n)
			now := epoch
			for r.nWaiting < 1000 {
				r.Offer(now, Offer{ID: "w", PromptTokens: 1024, MaxTokens: 128})
			}
			r.Take(new(Output))
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

// BenchmarkMemory reports the router's heap per waiting and per in-flight request: it holds
// 50,000 requests in flight and 10,000 waiting behind them (the goal: both under
// 256 MiB for the whole process).
func BenchmarkMemory(b *testing.B) {
	const inFlight, waiting = 50000, 10000
	for i := 0; i < b.N; i++ {
		cfg := config.Default()
		cfg.Router.WaitingSet.Capacity = waiting
		cfg.Router.WaitingSet.MaxWaitS = 1e9
		p := cfg.Profiles[config.DefaultProfileName]
		p.PrefillConcurrency = inFlight/32 + 1
		d := *p.Decode
		d.MaxStreams, d.MaxKVTokens = inFlight, 1<<40
		p.Decode = &d
		cfg.Profiles[config.DefaultProfileName] = p
		for e := 0; e < 64; e++ {
			role := "prefill"
			if e%2 == 1 {
				role = "decode"
			}
			cfg.Engines = append(cfg.Engines, config.Engine{ID: fmt.Sprintf("e%d", e), Address: fmt.Sprintf("10.0.0.%d:8000", e), Role: role, Profile: config.DefaultProfileName})
		}
		f, _ := fleet.New(cfg, epoch)
		prefix := make([]uint64, 32)
		heap := func() uint64 {
			runtime.GC()
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			return m.HeapAlloc
		}
		base := heap()
		r := New(cfg, f.Snapshot(), epoch)
		for k := 0; k < inFlight; k++ {
			if o := r.Offer(epoch, Offer{ID: "r", PromptTokens: 1024, MaxTokens: 128, Prefix: prefix}); o.Status != Dispatched {
				b.Fatalf("in flight %d: %+v", k, o)
			}
		}
		mid := heap()
		for r.nWaiting == 0 { // fill the last prefill slots
			r.Offer(epoch, Offer{ID: "r", PromptTokens: 1024, MaxTokens: 128, Prefix: prefix})
		}
		r.Cancel(epoch, r.waiting.at(0))
		for k := 0; k < waiting; k++ {
			if o := r.Offer(epoch, Offer{ID: "r", PromptTokens: 1024, MaxTokens: 128, Prefix: prefix}); o.Status != Waiting {
				b.Fatalf("waiting %d: %+v", k, o)
			}
		}
		end := heap()
		b.ReportMetric(float64(mid-base)/inFlight, "B/in-flight")
		b.ReportMetric(float64(end-mid)/waiting, "B/waiting")
		b.ReportMetric(float64(end-base)/(1<<20), "MiB-total")
		runtime.KeepAlive(r)
	}
}

// BenchmarkPrice measures one Price of the current split (docs/role-control.md section 3: the
// waiting set and the priced demand of the next step list-scheduled onto the prefill pool, the
// decode pool loaded with the waiting requests' streams) with waiting requests behind full
// prefill engines. Offers arrive 100 a second, so the priced demand of a 5 s step injects
// about 500 more.
func BenchmarkPrice(b *testing.B) {
	for _, n := range []int{8, 64, 1024} {
		for _, waiting := range []int{100, 1000, 10000} {
			b.Run(fmt.Sprintf("engines=%d/waiting=%d", n, waiting), func(b *testing.B) {
				r := benchRouter(b, n)
				now := epoch
				for i := 0; r.Snapshot(now).Retained.Waiting < waiting; i++ {
					now = now.Add(10 * time.Millisecond)
					if o := r.Offer(now, Offer{ID: "r", PromptTokens: 512 + i%1024, MaxTokens: 64}); o.Status == Rejected {
						b.Fatalf("rejected: %+v", o)
					}
				}
				split := r.CurrentSplit()
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					_, _ = r.Price(now, Query{Splits: []Split{split}, StepS: 5})
				}
			})
		}
	}
}

// BenchmarkFork measures the copy the controller takes under the live router's lock before it
// prices outside it.
func BenchmarkFork(b *testing.B) {
	for _, n := range []int{64, 1024} {
		for _, waiting := range []int{1000, 10000} {
			b.Run(fmt.Sprintf("engines=%d/waiting=%d", n, waiting), func(b *testing.B) {
				r := benchRouter(b, n)
				now := epoch
				for i := 0; r.Snapshot(now).Retained.Waiting < waiting; i++ {
					now = now.Add(10 * time.Millisecond)
					r.Offer(now, Offer{ID: "r", PromptTokens: 512 + i%1024, MaxTokens: 64})
				}
				f := r.Fork(nil)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					f = r.Fork(f)
				}
			})
		}
	}
}

// BenchmarkSnapshot measures Snapshot (what /narwhal/state, /metrics, the history sampler and
// every controller evaluation read) with streams decoding on the decode engines: 16 a decode
// engine, one of them finished before each op, so that every engine's projected drain is stale.
func BenchmarkSnapshot(b *testing.B) {
	for _, n := range []int{64, 1024} {
		b.Run(fmt.Sprintf("engines=%d", n), func(b *testing.B) {
			r := benchRouter(b, n)
			now := epoch
			var decoding []Handle
			for len(decoding) < 16*n/2 {
				now = now.Add(time.Microsecond)
				o := r.Offer(now, Offer{ID: "d", PromptTokens: 64, MaxTokens: 4000})
				if o.Status != Dispatched {
					b.Fatalf("not placed: %+v", o)
				}
				_ = r.FirstToken(now, o.Handle)
				decoding = append(decoding, o.Handle)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				for k := range r.engines {
					r.engines[k].drainOK = false
				}
				b.StartTimer()
				_ = r.Snapshot(now)
			}
		})
	}
}

// BenchmarkObserve measures one engine's metrics reading (Observe) with 1,000 requests waiting
// behind full prefill engines: "steady", a reading that changes nothing the projection sees (the
// common case, every health.metrics.interval_s for every engine); "foreign", one whose foreign
// prefill work changes, which recomputes the waiting set's projection.
func BenchmarkObserve(b *testing.B) {
	r := benchRouter(b, 64)
	now := epoch
	for i := range 1000 {
		r.Offer(now, Offer{ID: "w", PromptTokens: 4000 + i%7, MaxTokens: 200})
	}
	b.Run("steady", func(b *testing.B) {
		b.ReportAllocs()
		o := &Observation{Running: 1}
		for b.Loop() {
			r.Observe(now, "e0", o)
		}
	})
	b.Run("foreign", func(b *testing.B) {
		b.ReportAllocs()
		os := [2]*Observation{{Running: 50}, {Running: 60}}
		k := 0
		for b.Loop() {
			k++
			r.Observe(now, "e0", os[k%2])
		}
	})
}
