package controller

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/internal/logbuf"
	"github.com/narwhal-llm/narwhal/router"
)

// jsonLines decodes every line the log wrote.
func jsonLines(t *testing.T, b *logbuf.Buffer) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("%s: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

// The live wrapper in real time: an urgent trigger from the live router leads to one
// evaluation after urgent_delay_s that moves a decode engine to prefill in the fleet; the
// router follows the fleet and places the waiting request on it; the decision log has the
// config, the snapshot, the role event naming its decision, and the decision.
func TestLiveUrgentMove(t *testing.T) {
	cfg := config.Default()
	cfg.Controller.Reactive.UrgentDelayS = 0.05
	cfg.Controller.Reactive.EvidenceSpanS = 0.01
	cfg.Controller.Reactive.EvidenceMinArrivals = 0
	p := cfg.Profiles[config.DefaultProfileName]
	p.PrefillConcurrency = 1
	cfg.Profiles[config.DefaultProfileName] = p
	cfg.Engines = []config.Engine{
		{ID: "e1", Address: "10.0.0.1:80", Role: "prefill", Profile: config.DefaultProfileName},
		{ID: "e2", Address: "10.0.0.2:80", Role: "decode", Profile: config.DefaultProfileName},
		{ID: "e3", Address: "10.0.0.3:80", Role: "decode", Profile: config.DefaultProfileName},
	}
	start := time.Now()
	f, err := fleet.New(cfg, start)
	if err != nil {
		t.Fatal(err)
	}
	var buf logbuf.Buffer
	dlog := NewLog(&buf, start, cfg, f.Snapshot())
	f.OnChange(dlog.Fleet)
	var roles *Live
	rl := router.NewLive(router.New(cfg, f.Snapshot(), start), time.Now, router.Hooks{Trigger: func(tr router.Trigger) { roles.Trigger(tr) }})
	decided := make(chan Decision, 16)
	roles = NewLive(New(cfg, start), LiveOptions{Fleet: f, Router: rl, Log: dlog, Observer: observerFunc(func(d *Decision) {
		select {
		case decided <- *d:
		default:
		}
	})})
	changed, unsubscribe := f.Subscribe()
	defer unsubscribe()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = rl.Run(ctx) })
	wg.Go(func() { rl.Follow(ctx, f) })
	wg.Go(func() { _ = roles.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	first, err := rl.Offer(ctx, router.Offer{ID: "a", PromptTokens: 16000, MaxTokens: 10})
	if err != nil || first.Status != router.Dispatched {
		t.Fatalf("a: %+v %v", first, err)
	}
	placed := make(chan router.Outcome, 1)
	wg.Go(func() { // b waits behind a, triggers, and is placed once the move lands
		out, _ := rl.Offer(ctx, router.Offer{ID: "b", PromptTokens: 16000, MaxTokens: 10})
		placed <- out
	})
	deadline := time.After(10 * time.Second)
	for moved := false; !moved; {
		select {
		case <-changed:
			e, _ := f.Engine("e3")
			moved = e.Role == fleet.Prefill
		case <-deadline:
			t.Fatalf("no move; decisions %+v", roles.Recent())
		}
	}
	select {
	case out := <-placed:
		if out.Status != router.Dispatched || out.Placement.Prefill != "e3" {
			t.Fatalf("b: %+v", out)
		}
	case <-deadline:
		t.Fatal("b was not placed on the new prefill engine")
	}
	var seq uint64
	for seq == 0 {
		select {
		case d := <-decided:
			if d.Caller == CallerUrgent && d.Outcome == OutcomeMoved {
				seq = d.Seq
			}
		case <-deadline:
			t.Fatal("no urgent decision observed")
		}
	}
	if r := roles.Recent(); r[len(r)-1].Seq != seq {
		t.Fatalf("recent %+v", r)
	}
	lines := jsonLines(t, &buf)
	if len(lines) < 4 || lines[0]["kind"] != "config" || lines[1]["event"] != "snapshot" {
		t.Fatalf("log starts %v", lines)
	}
	var sawEvent, sawDecision bool
	for _, l := range lines[2:] {
		switch {
		case l["kind"] == "fleet" && l["event"] == "role" && l["engine"] == "e3":
			sawEvent = l["decision"] == float64(seq) && l["from"] == "decode" && l["to"] == "prefill" && !sawDecision
		case l["kind"] == "decision" && l["seq"] == float64(seq):
			sawDecision = l["outcome"] == "moved" && l["caller"] == "urgent"
		}
	}
	if !sawEvent || !sawDecision {
		t.Fatalf("log: role event naming decision %d then the decision, got %v", seq, lines)
	}
}

type observerFunc func(*Decision)

func (f observerFunc) ObserveDecision(d *Decision, _ time.Duration) { f(d) }

// Ratios are JSON numbers, "+Inf" beyond capacity, and never invalid JSON.
func TestRatioJSON(t *testing.T) {
	for _, c := range []struct {
		r    Ratio
		want string
	}{{0.5, "0.5"}, {Ratio(math.Inf(1)), `"+Inf"`}, {Ratio(math.NaN()), "null"}, {1.23456789, "1.23457"}} {
		b, err := json.Marshal(c.r)
		if err != nil || string(b) != c.want {
			t.Fatalf("%v: %s %v, want %s", float64(c.r), b, err, c.want)
		}
		var back Ratio
		if c.want != "null" {
			if err := json.Unmarshal(b, &back); err != nil || (back != c.r && !(math.IsInf(float64(back), 1) && math.IsInf(float64(c.r), 1)) && c.want != "1.23457") {
				t.Fatalf("%s back: %v %v", b, back, err)
			}
		}
	}
}
