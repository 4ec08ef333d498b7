package ha

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/internal/etcdtest"
)

func dial(t *testing.T, endpoints []string, id string) *Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := Dial(ctx, Options{Endpoints: endpoints, Prefix: "/narwhal-test", LeaseTTLS: 2, ID: id})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

// leaderAndStandby starts an etcd server and two replicas on it, a leading (its campaign won)
// and b not campaigning yet; ctx bounds the test.
func leaderAndStandby(t *testing.T) (a, b *Node, ctx context.Context) {
	t.Helper()
	srv := etcdtest.Start(t)
	a, b = dial(t, srv.Endpoints, "a"), dial(t, srv.Endpoints, "b")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	if err := a.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	return a, b, ctx
}

// Against a real etcd: one replica leads; its fenced writes succeed and a standby reads and
// watches them; once its lease is gone (the session closed, as when its process dies) its
// writes are refused with ErrNotLeader, and the standby, whose campaign was waiting, leads and
// writes.
func TestElectionAndFencedWrites(t *testing.T) {
	a, b, ctx := leaderAndStandby(t)
	if id, err := b.Leader(ctx); err != nil || id != "a" {
		t.Fatalf("leader %q %v, want a", id, err)
	}
	rev, err := a.Save(ctx, []byte(`{"v":1}`))
	if err != nil {
		t.Fatal(err)
	}
	data, got, err := b.Load(ctx)
	if err != nil || string(data) != `{"v":1}` || got != rev {
		t.Fatalf("standby reads %q at %d (%v), want the leader's write at %d", data, got, err, rev)
	}
	watch := b.Watch(ctx, rev)
	if _, err := a.Save(ctx, []byte(`{"v":2}`)); err != nil {
		t.Fatal(err)
	}
	if w := <-watch; string(w) != `{"v":2}` {
		t.Fatalf("the standby watched %q", w)
	}

	won := make(chan error, 1)
	go func() { won <- b.Campaign(ctx) }()
	select {
	case err := <-won:
		t.Fatalf("b won while a leads: %v", err)
	case <-time.After(200 * time.Millisecond): // a bound on how long b may wrongly take, not a synchronisation
	}
	// a loses its lease: revoked, as etcd does when a dead process's lease expires.
	if _, err := a.cli.Revoke(ctx, a.sess.Lease()); err != nil {
		t.Fatal(err)
	}
	if err := <-won; err != nil {
		t.Fatalf("b's campaign: %v", err)
	}
	if _, err := a.Save(ctx, []byte(`{"v":"stale"}`)); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("the deposed leader's write: %v, want ErrNotLeader", err)
	}
	select {
	case <-a.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the deposed leader's session did not end")
	}
	if _, err := b.Save(ctx, []byte(`{"v":3}`)); err != nil {
		t.Fatalf("the new leader's write: %v", err)
	}
	if data, _, _ := b.Load(ctx); string(data) != `{"v":3}` {
		t.Fatalf("state %q", data)
	}
	if id, _ := b.Leader(ctx); id != "b" {
		t.Fatalf("leader %q, want b", id)
	}
}

// A leader that resigns hands over at once: the standby's campaign returns.
func TestResignHandsOver(t *testing.T) {
	a, b, ctx := leaderAndStandby(t)
	won := make(chan error, 1)
	go func() { won <- b.Campaign(ctx) }()
	begin := time.Now()
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-won; err != nil {
		t.Fatal(err)
	}
	t.Logf("handover after Resign: %v", time.Since(begin))
	if _, err := a.Save(ctx, []byte("x")); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("the resigned leader's write: %v", err)
	}
}

// BenchmarkSave is one fenced state write (a 64-engine state, about 20 KB) to an etcd server
// embedded in the benchmark (its WAL fsyncs on this machine's disk).
func BenchmarkSave(b *testing.B) {
	srv := etcdtest.Start(b)
	ctx := context.Background()
	n, err := Dial(ctx, Options{Endpoints: srv.Endpoints, Prefix: "/bench", LeaseTTLS: 5, ID: "a"})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	if err := n.Campaign(ctx); err != nil {
		b.Fatal(err)
	}
	data := bytes.Repeat([]byte(`{"id":"e00","role":"decode","moved":false}`), 470) // ~20 KB
	lat := make([]time.Duration, 0, b.N)
	for b.Loop() {
		begin := time.Now()
		if _, err := n.Save(ctx, data); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(begin))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
