package router

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

func liveFixture(t *testing.T, tweak func(*config.Config)) (*Live, *fleet.Fleet, context.CancelFunc) {
	t.Helper()
	cfg := config.Default()
	cfg.Router.LocalPrefill = config.LocalPrefillOff // requests wait for a prefill engine
	for i, role := range []string{"prefill", "prefill", "decode", "decode"} {
		cfg.Engines = append(cfg.Engines, config.Engine{ID: fmt.Sprintf("e%d", i+1), Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Role: role, Profile: config.DefaultProfileName})
	}
	if tweak != nil {
		tweak(cfg)
	}
	f, err := fleet.New(cfg, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	l := NewLive(New(cfg, f.Snapshot(), time.Now()), time.Now, Hooks{})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = l.Run(ctx) })
	wg.Go(func() { l.Follow(ctx, f) })
	return l, f, func() { cancel(); wg.Wait() }
}

// TestLiveConcurrent offers from many goroutines at once; each request then streams, completes,
// fails or is cancelled, some while waiting. Afterwards the accounting balances and nothing is
// held (run under -race).
func TestLiveConcurrent(t *testing.T) {
	defer goleak.VerifyNone(t)
	l, _, stop := liveFixture(t, func(c *config.Config) {
		p := c.Profiles[config.DefaultProfileName]
		p.PrefillConcurrency = 2
		c.Profiles[config.DefaultProfileName] = p
	})
	defer stop()
	const workers, each = 16, 50
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			for i := 0; i < each; i++ {
				ctx, cancel := context.WithCancel(context.Background())
				if i%7 == 3 {
					cancel() // the client is gone before or while it waits
				}
				out, err := l.Offer(ctx, Offer{ID: "r", PromptTokens: 100 + i, MaxTokens: 10})
				cancel()
				if err != nil || out.Status != Dispatched {
					continue
				}
				switch i % 4 {
				case 0:
					_ = l.FirstToken(out.Handle)
					_ = l.Complete(out.Handle, 10)
				case 1:
					_ = l.Complete(out.Handle, 0)
				case 2:
					_ = l.Fail(out.Handle, FailRequest)
				case 3:
					_ = l.FirstToken(out.Handle)
					_ = l.Cancel(out.Handle)
				}
			}
		})
	}
	wg.Wait()
	s := l.Snapshot()
	if broken := s.Conserved(); broken != "" {
		t.Fatalf("%s: %+v", broken, s.Counters)
	}
	if s.Counters.Offers != workers*each || s.Retained.Waiting+s.Retained.Prefilling+s.Retained.Decoding != 0 {
		t.Fatalf("offers %d, retained %+v", s.Counters.Offers, s.Retained)
	}
	if s.Counters.Cancelled.Waiting == 0 && s.Counters.Cancelled.InFlight == 0 {
		t.Fatal("no cancel was exercised")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.waiters) != 0 {
		t.Fatalf("%d waiters left", len(l.waiters))
	}
}

// TestLiveWaitTimeout: a request that waits past max_wait_s is answered wait_timeout by the
// timer loop (no other event needed).
func TestLiveWaitTimeout(t *testing.T) {
	defer goleak.VerifyNone(t)
	l, f, stop := liveFixture(t, func(c *config.Config) { c.Router.WaitingSet.MaxWaitS = 0.05 })
	defer stop()
	// Fill every prefill slot (2 engines × 4) so that the next offer waits.
	var held []Handle
	for i := 0; i < 8; i++ {
		out, err := l.Offer(context.Background(), Offer{ID: "h", PromptTokens: 100, MaxTokens: 10})
		if err != nil || out.Status != Dispatched {
			t.Fatalf("offer %d: %+v %v", i, out, err)
		}
		held = append(held, out.Handle)
	}
	begin := time.Now()
	out, err := l.Offer(context.Background(), Offer{ID: "late", PromptTokens: 100, MaxTokens: 10})
	if err != nil || out.Status != Rejected || out.Code != WaitTimeout {
		t.Fatalf("waiting offer: %+v %v", out, err)
	}
	if waited := time.Since(begin); waited < 50*time.Millisecond {
		t.Fatalf("rejected after %v, before max_wait_s", waited)
	}
	// A prefill engine failing does not lose its residents; completing them empties the router.
	if _, err := f.SetLifecycle("e1", fleet.Failed, time.Now(), "test"); err != nil {
		t.Fatal(err)
	}
	for _, h := range held {
		if err := l.Fail(h, FailRequest); err != nil {
			t.Fatal(err)
		}
	}
	s := l.Snapshot()
	if s.Conserved() != "" || s.Counters.Failed != 8 || s.Counters.Overflow.WaitTimeout != 1 {
		t.Fatalf("%+v", s.Counters)
	}
}

// TestLiveFirstTokenTimeout: a request placed at once on an idle fleet (nothing else happens)
// is counted as a first-token timeout by the timer loop once router.first_token_timeout_s passes.
func TestLiveFirstTokenTimeout(t *testing.T) {
	defer goleak.VerifyNone(t)
	l, _, stop := liveFixture(t, func(c *config.Config) { c.Router.FirstTokenTimeoutS = 0.05 })
	defer stop()
	awaitArmed(t, l) // Run sleeps on its idle timer: the offer's deadline must wake it
	out, err := l.Offer(context.Background(), Offer{ID: "slow", PromptTokens: 100, MaxTokens: 10})
	if err != nil || out.Status != Dispatched {
		t.Fatalf("%+v %v", out, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.Await(ctx, func(s Snapshot) bool { return s.Counters.FirstTokenTimeouts == 1 }); err != nil {
		t.Fatalf("not counted: %+v", l.Snapshot().Counters)
	}
	_ = l.Complete(out.Handle, 0)
}

// awaitArmed waits until Run has armed its timer once (its first tick signals Changed, and sets
// armed under the same lock).
func awaitArmed(t *testing.T, l *Live) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		ch := l.Changed()
		l.mu.Lock()
		armed := !l.armed.IsZero()
		l.mu.Unlock()
		if armed {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatal("Run never armed its timer")
		}
	}
}

// Await sees every kind of change: a condition made true by an offer, by a response event, by
// an invalid offer, and by Run's tick alone; a cancelled context ends it with its error.
func TestLiveAwait(t *testing.T) {
	defer goleak.VerifyNone(t)
	l, _, stop := liveFixture(t, func(c *config.Config) { c.Router.FirstTokenTimeoutS = 0.05 })
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	results := make(chan error, 1)
	go func() {
		results <- l.Await(ctx, func(s Snapshot) bool { return s.Counters.Invalid == 1 })
	}()
	l.Invalid()
	if err := <-results; err != nil {
		t.Fatal(err)
	}
	go func() {
		results <- l.Await(ctx, func(s Snapshot) bool { return s.Counters.Completed == 1 })
	}()
	out, err := l.Offer(ctx, Offer{ID: "a", PromptTokens: 100, MaxTokens: 10})
	if err != nil {
		t.Fatal(err)
	}
	_ = l.FirstToken(out.Handle)
	_ = l.Complete(out.Handle, 10)
	if err := <-results; err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithCancel(ctx)
	cancelShort()
	if err := l.Await(short, func(Snapshot) bool { return false }); err != context.Canceled {
		t.Fatalf("Await on a cancelled context: %v", err)
	}
}
