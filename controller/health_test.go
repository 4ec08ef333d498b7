package controller

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/internal/poll"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func testFleet(t *testing.T) (*config.Config, *fleet.Fleet) {
	t.Helper()
	c := config.Default()
	for i, role := range []string{"prefill", "prefill", "decode", "decode"} {
		c.Engines = append(c.Engines, config.Engine{
			ID: "e" + string(rune('1'+i)), Address: "127.0.0.1:" + string(rune('1'+i)) + "000",
			Role: role, Profile: config.DefaultProfileName,
		})
	}
	f, err := fleet.New(c, t0)
	if err != nil {
		t.Fatal(err)
	}
	return c, f
}

// fakeClock is virtual time: After fires only when the test advances the clock.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []waiter
}

type waiter struct {
	at time.Time
	ch chan time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, waiter{c.now.Add(d), ch})
	return ch
}

func (c *fakeClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}

// advanceTo moves virtual time to at and fires the timers due.
func (c *fakeClock) advanceTo(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = at
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if w.at.After(at) {
			kept = append(kept, w)
			continue
		}
		w.ch <- at
	}
	c.waiters = kept
}

// scriptProber answers from a per-address script of up/down periods in virtual time.
type scriptProber struct {
	clock *fakeClock
	mu    sync.Mutex
	down  map[string]bool
	calls int
}

func (p *scriptProber) set(addr string, down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down[addr] = down
}

func (p *scriptProber) Probe(_ context.Context, address string) (netip.AddrPort, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	ap := netip.MustParseAddrPort(address)
	if p.down[address] {
		return ap, errors.New("connection refused")
	}
	return ap, nil
}

type countObserver struct {
	mu      sync.Mutex
	ok, bad int
}

func (o *countObserver) ObserveProbe(_ string, ok bool, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if ok {
		o.ok++
	} else {
		o.bad++
	}
}

// TestMonitorVirtualTime runs the live monitor loop on a virtual clock: an engine that stops
// answering is failed within unhealthy_after × interval_s (+ one interval), and once it answers
// again it comes back through recovering to active after healthy_after probes and recover_s.
func TestMonitorVirtualTime(t *testing.T) {
	cfg, f := testFleet(t)
	h := cfg.Health // interval 1 s, unhealthy_after 3, healthy_after 3, recover_s 10
	clock := &fakeClock{now: t0}
	prober := &scriptProber{clock: clock, down: map[string]bool{}}
	obs := &countObserver{}
	m := NewMonitor(h, f, prober, clock.Now, clock.After, obs, nil)

	type seen struct {
		at time.Time
		to string
	}
	var mu sync.Mutex
	var history []seen
	f.OnChange(func(ev fleet.Event) {
		if ev.Engine == "e3" && ev.Kind == fleet.EventLifecycle {
			mu.Lock()
			history = append(history, seen{ev.Time, ev.To})
			mu.Unlock()
		}
	})

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()

	interval := config.Seconds(h.IntervalS)
	idle := func() { // wait until the loop has finished its pass and waits for the next
		t.Helper()
		poll.Until(t, 10*time.Second, "the monitor waiting for its next pass", func() bool { return clock.pending() > 0 })
	}
	passes := func(n int) {
		for i := 0; i < n; i++ {
			idle()
			clock.advanceTo(clock.Now().Add(interval))
		}
		idle()
	}
	passes(5)
	prober.set("127.0.0.1:3000", true) // stops answering right after a pass
	stoppedAt := clock.Now()
	passes(10)
	prober.set("127.0.0.1:3000", false)
	back := clock.Now()
	passes(20)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run returned %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(history) != 3 || history[0].to != "failed" || history[1].to != "recovering" || history[2].to != "active" {
		t.Fatalf("e3 went through %+v, want failed, recovering, active", history)
	}
	limit := time.Duration(h.UnhealthyAfter)*interval + interval
	if d := history[0].at.Sub(stoppedAt); d <= 0 || d > limit {
		t.Fatalf("failed %v after it stopped answering, want within %v", d, limit)
	}
	if d := history[1].at.Sub(back); d > time.Duration(h.HealthyAfter)*interval+interval {
		t.Fatalf("recovering %v after it came back", d)
	}
	if d := history[2].at.Sub(history[1].at); d < config.Seconds(h.RecoverS) || d > config.Seconds(h.RecoverS)+interval {
		t.Fatalf("active %v after recovering began, want recover_s %vs (+ one interval)", d, h.RecoverS)
	}
	for _, id := range []string{"e1", "e2", "e4"} {
		if e, _ := f.Engine(id); e.Lifecycle != fleet.Active {
			t.Fatalf("%s is %s; only e3 failed", id, e.Lifecycle)
		}
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.bad != 10 || obs.ok+obs.bad != prober.calls {
		t.Fatalf("observer saw %d ok + %d failed probes, prober answered %d (10 failed)", obs.ok, obs.bad, prober.calls)
	}
}

// TestHealthRules drives the core directly with probe results at virtual times.
func TestHealthRules(t *testing.T) {
	type probe struct {
		at   float64 // seconds after t0
		ok   bool
		want string // lifecycle after the probe
	}
	tests := []struct {
		name   string
		before func(f *fleet.Fleet) // operator actions before the probes
		probes []probe
	}{
		{"two failures are not enough", nil, []probe{
			{1, false, "active"}, {2, false, "active"}, {3, true, "active"}, {4, false, "active"}, {5, false, "active"},
		}},
		{"three consecutive failures fail", nil, []probe{
			{1, false, "active"}, {2, false, "active"}, {3, false, "failed"},
		}},
		{"recovery needs healthy_after then recover_s", nil, []probe{
			{1, false, "active"}, {2, false, "active"}, {3, false, "failed"},
			{4, true, "failed"}, {5, true, "failed"}, {6, true, "recovering"},
			{15, true, "recovering"}, {16, true, "active"},
		}},
		{"one failure while recovering fails again", nil, []probe{
			{1, false, "active"}, {2, false, "active"}, {3, false, "failed"},
			{4, true, "failed"}, {5, true, "failed"}, {6, true, "recovering"},
			{7, false, "failed"}, {8, true, "failed"},
		}},
		{"a drained engine ignores its probes", func(f *fleet.Fleet) {
			_, _ = f.Drain("e1", t0, "admin", fleet.Floors{})
		}, []probe{
			{1, false, "draining"}, {2, false, "draining"}, {3, false, "draining"}, {4, true, "draining"},
			{5, true, "draining"}, {6, true, "draining"},
		}},
		{"an undrained engine counts from the undrain", func(f *fleet.Fleet) {
			_, _ = f.Drain("e1", t0, "admin", fleet.Floors{})
			_, _ = f.Undrain("e1", t0, "admin")
		}, []probe{
			{1, true, "draining"}, {2, true, "draining"}, {3, true, "recovering"}, {13, true, "active"},
		}},
		{"an undrained engine that fails is failed", func(f *fleet.Fleet) {
			_, _ = f.Drain("e1", t0, "admin", fleet.Floors{})
			_, _ = f.Undrain("e1", t0, "admin")
		}, []probe{
			{1, false, "draining"}, {2, false, "draining"}, {3, false, "failed"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, f := testFleet(t)
			if tt.before != nil {
				tt.before(f)
			}
			h := NewHealth(cfg.Health)
			for _, p := range tt.probes {
				at := t0.Add(time.Duration(p.at * float64(time.Second)))
				if _, err := Apply(h, f, at, "e1", p.ok); err != nil {
					t.Fatalf("t=%v: %v", p.at, err)
				}
				if e, _ := f.Engine("e1"); e.Lifecycle.String() != p.want {
					t.Fatalf("t=%vs probe ok=%v: lifecycle %s, want %s", p.at, p.ok, e.Lifecycle, p.want)
				}
			}
		})
	}
	_, f := testFleet(t)
	if _, err := Apply(NewHealth(config.Default().Health), f, t0, "nope", true); !errors.Is(err, fleet.ErrUnknownEngine) {
		t.Fatalf("unknown engine: %v", err)
	}
}

// An engine that passive health checking marked failed between probes is readmitted only
// after health.healthy_after good probes counted from that change, not from the good probes
// it had before (issue 7).
func TestHealthCountsFromPassiveFailure(t *testing.T) {
	c, f := testFleet(t)
	h := NewHealth(c.Health)
	now := t0
	for i := 0; i < 5; i++ { // a long run of good probes
		now = now.Add(time.Second)
		if to, err := Apply(h, f, now, "e3", true); err != nil || to != 0 {
			t.Fatalf("probe %d: %v %v", i, to, err)
		}
	}
	now = now.Add(100 * time.Millisecond)
	if _, err := f.SetLifecycle("e3", fleet.Failed, now, "passive"); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= c.Health.HealthyAfter; i++ {
		now = now.Add(time.Second)
		to, err := Apply(h, f, now, "e3", true)
		if err != nil {
			t.Fatal(err)
		}
		if want := fleet.Lifecycle(0); i == c.Health.HealthyAfter {
			if to != fleet.Recovering {
				t.Fatalf("probe %d after the passive failure: %v, want recovering", i, to)
			}
		} else if to != want {
			t.Fatalf("probe %d after the passive failure moved it to %v; it must count %d good probes from the failure", i, to, c.Health.HealthyAfter)
		}
	}
}

// An engine the data path failed (passive health) whose probes never fail until it is
// readmitted is readmitted unconfirmed; failed so a second time, still with no failed probe, it
// is readmitted blind: the probes do not see what the data path sees (llm-d's P/D sidecar
// answers /health for a dead engine; issue 33). One failed probe in between confirms them; a
// failure the probes made themselves is confirmed from the start.
func TestHealthReadmissionSight(t *testing.T) {
	for _, c := range []struct {
		name     string
		failures []string // per outage: "passive", "passive+bad" (a failed probe while failed) or "probes"
		want     fleet.Sight
	}{
		{"passive, probes always good", []string{"passive"}, fleet.SightUnconfirmed},
		{"passive twice, probes always good", []string{"passive", "passive"}, fleet.SightBlind},
		{"passive three times", []string{"passive", "passive", "passive"}, fleet.SightBlind},
		{"passive, a probe failed since", []string{"passive+bad"}, fleet.SightConfirmed},
		{"passive twice, a probe failed in the second", []string{"passive", "passive+bad"}, fleet.SightConfirmed},
		{"passive after a probe failure", []string{"passive+bad", "passive"}, fleet.SightUnconfirmed},
		{"failed by its probes", []string{"probes"}, fleet.SightConfirmed},
		{"failed by its probes, then passive", []string{"probes", "passive"}, fleet.SightUnconfirmed},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, f := testFleet(t)
			h := NewHealth(cfg.Health)
			now := t0
			probe := prober(t, h, f, &now)
			for _, how := range c.failures {
				probe(true) // active, answering
				if how == "probes" {
					for probe(false) != fleet.Failed {
					}
				} else if _, err := f.Eject("e3", 3, now); err != nil {
					t.Fatal(err)
				}
				if how == "passive+bad" {
					probe(false)
				}
				for probe(true) != fleet.Active {
				}
			}
			e, _ := f.Engine("e3")
			if e.Sight != c.want {
				t.Fatalf("readmitted %v, want %v", e.Sight, c.want)
			}
			// The next lifecycle change clears it.
			if _, err := f.Drain("e3", now, "test", fleet.Floors{}); err != nil {
				t.Fatal(err)
			}
			if e, _ := f.Engine("e3"); e.Sight != fleet.SightConfirmed {
				t.Fatalf("%v kept after a drain", e.Sight)
			}
		})
	}
}

// An engine the data path fails again and again while its probes pass recovers longer each
// time (health.recover_s times the failures, up to five minutes), as Envoy lengthens an
// ejection: each readmission of an engine the probes do not see costs the requests that eject
// it again. A failed probe ends it.
func TestHealthBlindEngineRecoversLonger(t *testing.T) {
	cfg, f := testFleet(t)
	h := NewHealth(cfg.Health)
	now := t0
	recover := config.Seconds(cfg.Health.RecoverS)
	// readmitAfter ejects e3 (passive), probes it good until readmitted, and returns how long it
	// took from recovering to active.
	readmitAfter := func(bad bool) time.Duration {
		t.Helper()
		now = now.Add(time.Second)
		if _, err := f.Eject("e3", 3, now); err != nil {
			t.Fatal(err)
		}
		if bad {
			now = now.Add(time.Second)
			if _, err := Apply(h, f, now, "e3", false); err != nil {
				t.Fatal(err)
			}
		}
		var since time.Time
		for {
			now = now.Add(time.Second)
			to, err := Apply(h, f, now, "e3", true)
			if err != nil {
				t.Fatal(err)
			}
			switch to {
			case fleet.Recovering:
				since = now
			case fleet.Active:
				return now.Sub(since)
			}
		}
	}
	for i, want := range []time.Duration{recover, 2 * recover, 3 * recover} {
		if got := readmitAfter(false); got < want || got > want+time.Second {
			t.Fatalf("ejection %d: recovered in %v, want %v", i+1, got, want)
		}
	}
	if got := readmitAfter(true); got < recover || got > recover+time.Second {
		t.Fatalf("after a failed probe: recovered in %v, want %v", got, recover)
	}
	for range 100 {
		readmitAfter(false)
	}
	if got := readmitAfter(false); got < maxBlindRecover || got > maxBlindRecover+time.Second {
		t.Fatalf("after 100 ejections: recovered in %v, want the cap %v", got, maxBlindRecover)
	}
}

// A data-path failure at the very instant of the core's own readmission is still the data
// path's: the streak starts over from it (healthy_after good probes before recovering), and it
// counts toward blindness. An engine that then stays active five minutes without the data path
// failing it starts over: one more failure finds it unconfirmed, not blind.
func TestHealthStreakEdges(t *testing.T) {
	cfg, f := testFleet(t)
	h := NewHealth(cfg.Health)
	now := t0
	probe := prober(t, h, f, &now)
	readmit := func() {
		t.Helper()
		for probe(true) != fleet.Active {
		}
	}
	probe(true)
	if _, err := f.Eject("e3", 3, now); err != nil {
		t.Fatal(err)
	}
	readmit()
	if _, err := f.Eject("e3", 3, now); err != nil { // the instant of the readmission
		t.Fatal(err)
	}
	for i := 1; i <= cfg.Health.HealthyAfter; i++ {
		to := probe(true)
		if want := fleet.Lifecycle(0); i == cfg.Health.HealthyAfter {
			want = fleet.Recovering
			if to != want {
				t.Fatalf("probe %d after the failure: %v, want recovering", i, to)
			}
		} else if to != want {
			t.Fatalf("probe %d after a failure at the readmission's instant: %v; it must count %d good probes from it", i, to, cfg.Health.HealthyAfter)
		}
	}
	readmit()
	if e, _ := f.Engine("e3"); e.Sight != fleet.SightBlind {
		t.Fatalf("readmitted %v after two data-path failures, want blind", e.Sight)
	}
	for end := now.Add(maxBlindRecover); now.Before(end); {
		probe(true)
	}
	if _, err := f.Eject("e3", 3, now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Second)
	readmit()
	if e, _ := f.Engine("e3"); e.Sight != fleet.SightUnconfirmed {
		t.Fatalf("readmitted %v after five minutes served and one failure, want unconfirmed", e.Sight)
	}
}

// prober probes e3 of f through h (Apply), a second after the last probe each time (*now moves
// on), and returns the transition made.
func prober(t *testing.T, h *Health, f *fleet.Fleet, now *time.Time) func(ok bool) fleet.Lifecycle {
	return func(ok bool) fleet.Lifecycle {
		t.Helper()
		*now = now.Add(time.Second)
		to, err := Apply(h, f, *now, "e3", ok)
		if err != nil {
			t.Fatal(err)
		}
		return to
	}
}
