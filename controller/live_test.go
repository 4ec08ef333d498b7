package controller

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/decisionlog"
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

// urgentFixture is a live controller, router and fleet (e1 prefill, e2 and e3 decode, one prefill
// slot each) with a fast urgent path, running until the test ends; persist is LiveOptions.Persist.
type urgentFixture struct {
	f       *fleet.Fleet
	rl      *router.Live
	roles   *Live
	buf     *logbuf.Buffer
	decided chan decisionlog.Decision
	changed <-chan struct{}
	ctx     context.Context
	wg      *sync.WaitGroup
}

func newUrgentFixture(t *testing.T, persist func(*decisionlog.Decision, Durable) error) *urgentFixture {
	t.Helper()
	cfg := config.Default()
	cfg.Router.LocalPrefill = config.LocalPrefillOff // only a move relieves the prefill pool
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
	fx := &urgentFixture{f: f, buf: &logbuf.Buffer{}, decided: make(chan decisionlog.Decision, 16), wg: &sync.WaitGroup{}}
	dlog := decisionlog.New(fx.buf, start, cfg, f.Snapshot())
	f.OnChange(dlog.Fleet)
	fx.rl = router.NewLive(router.New(cfg, f.Snapshot(), start), time.Now, router.Hooks{Trigger: func(tr router.Trigger) { fx.roles.Trigger(tr) }})
	fx.roles = NewLive(New(cfg, start), LiveOptions{Fleet: f, Router: fx.rl, Log: dlog, Persist: persist, Observer: observerFunc(func(d *decisionlog.Decision) {
		select {
		case fx.decided <- *d:
		default:
		}
	})})
	var unsubscribe func()
	fx.changed, unsubscribe = f.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	fx.ctx = ctx
	fx.wg.Go(func() { _ = fx.rl.Run(ctx) })
	fx.wg.Go(func() { fx.rl.Follow(ctx, f) })
	fx.wg.Go(func() { _ = fx.roles.Run(ctx) })
	t.Cleanup(func() { cancel(); fx.wg.Wait(); unsubscribe() })
	return fx
}

// The live wrapper in real time: an urgent trigger from the live router leads to one
// evaluation after urgent_delay_s that moves a decode engine to prefill in the fleet; the
// router follows the fleet and places the waiting request on it; the decision log has the
// config, the snapshot, the role event naming its decision, and the decision.
func TestLiveUrgentMove(t *testing.T) {
	fx := newUrgentFixture(t, nil)
	f, rl, roles, buf, decided, changed, ctx, wg := fx.f, fx.rl, fx.roles, fx.buf, fx.decided, fx.changed, fx.ctx, fx.wg

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
			if d.Caller == decisionlog.CallerUrgent && d.Outcome == decisionlog.OutcomeMoved {
				seq = d.Seq
			}
		case <-deadline:
			t.Fatal("no urgent decision observed")
		}
	}
	if r := roles.Recent(); r[len(r)-1].Seq != seq {
		t.Fatalf("recent %+v", r)
	}
	lines := jsonLines(t, buf)
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

type observerFunc func(*decisionlog.Decision)

func (f observerFunc) ObserveDecision(d *decisionlog.Decision, _ time.Duration) { f(d) }

// Ratios are JSON numbers, "+Inf" beyond capacity, and never invalid JSON.
func TestRatioJSON(t *testing.T) {
	for _, c := range []struct {
		r    decisionlog.Ratio
		want string
	}{{0.5, "0.5"}, {decisionlog.Ratio(math.Inf(1)), `"+Inf"`}, {decisionlog.Ratio(math.NaN()), "null"}, {1.23456789, "1.23457"}} {
		b, err := json.Marshal(c.r)
		if err != nil || string(b) != c.want {
			t.Fatalf("%v: %s %v, want %s", float64(c.r), b, err, c.want)
		}
		var back decisionlog.Ratio
		if c.want != "null" {
			if err := json.Unmarshal(b, &back); err != nil || (back != c.r && !(math.IsInf(float64(back), 1) && math.IsInf(float64(c.r), 1)) && c.want != "1.23457") {
				t.Fatalf("%s back: %v %v", b, back, err)
			}
		}
	}
}

// Issue 11: a move whose state cannot be written (etcd unavailable) is not applied — the
// engine keeps its role, the decision is recorded blocked saying why — and the router keeps
// placing with the roles it has. Persist gets the decision with its moves before the fleet
// changes.
func TestLiveMoveNotPersistedIsNotApplied(t *testing.T) {
	var asked []decisionlog.Move
	fx := newUrgentFixture(t, func(d *decisionlog.Decision, c Durable) error {
		asked = append(asked, d.Moves...)
		if c.Seq != d.Seq {
			t.Errorf("Persist got controller seq %d for decision %d", c.Seq, d.Seq)
		}
		return errors.New("etcd: context deadline exceeded")
	})
	first, err := fx.rl.Offer(fx.ctx, router.Offer{ID: "a", PromptTokens: 16000, MaxTokens: 10})
	if err != nil || first.Status != router.Dispatched {
		t.Fatalf("a: %+v %v", first, err)
	}
	placed := make(chan router.Outcome, 1)
	fx.wg.Go(func() {
		out, _ := fx.rl.Offer(fx.ctx, router.Offer{ID: "b", PromptTokens: 16000, MaxTokens: 10})
		placed <- out
	})
	deadline := time.After(10 * time.Second)
	var d decisionlog.Decision
	for d.Caller != decisionlog.CallerUrgent || !strings.Contains(d.Reason, "not applied") {
		select {
		case d = <-fx.decided:
		case <-deadline:
			t.Fatalf("no unapplied urgent move; decisions %+v", fx.roles.Recent())
		}
	}
	if d.Outcome != decisionlog.OutcomeBlocked || len(d.Moves) != 0 || d.SplitAfter != d.SplitBefore || !d.NotPersisted {
		t.Fatalf("decision %+v", d)
	}
	if len(asked) == 0 || asked[0].Engine != "e3" || asked[0].To != fleet.Prefill {
		t.Fatalf("Persist was asked %+v", asked)
	}
	if e, _ := fx.f.Engine("e3"); e.Role != fleet.Decode {
		t.Fatalf("e3 moved anyway: %+v", e)
	}
	_ = fx.rl.FirstToken(first.Handle)
	_ = fx.rl.Complete(first.Handle, 10)
	select { // b is placed on the roles Narwhal has: e1 prefills it once a is done
	case out := <-placed:
		if out.Status != router.Dispatched || out.Placement.Prefill != "e1" {
			t.Fatalf("b: %+v", out)
		}
	case <-deadline:
		t.Fatal("b was not placed")
	}
}

// The edge's acknowledgement is its own value (House III): Settled makes the record of what
// happened — a refused move left out with its reason, the split and outcome as they came out,
// or none applied — and leaves the proposal as the controller made it.
func TestSettledLeavesTheProposal(t *testing.T) {
	prop := decisionlog.Decision{Seq: 4, Outcome: decisionlog.OutcomeMoved, Reason: "repair",
		SplitBefore: decisionlog.Split{Prefill: 1, Decode: 3}, SplitAfter: decisionlog.Split{Prefill: 3, Decode: 1},
		Moves: []decisionlog.Move{{Engine: "e3", From: fleet.Decode, To: fleet.Prefill}, {Engine: "e4", From: fleet.Decode, To: fleet.Prefill}}}
	keep := prop
	keep.Moves = slices.Clone(prop.Moves)

	rec := Settled(prop, Ack{Refused: []Refusal{{"e3", fleet.ErrTransition}}, NotPersisted: true})
	if len(rec.Moves) != 1 || rec.Moves[0].Engine != "e4" || rec.SplitAfter != (decisionlog.Split{Prefill: 2, Decode: 2}) ||
		rec.Outcome != decisionlog.OutcomeMoved || !rec.NotPersisted || rec.Reason != "repair; the fleet refused moving e3: "+fleet.ErrTransition.Error() {
		t.Fatalf("one refused: %+v", rec)
	}
	rec = Settled(prop, Ack{Refused: []Refusal{{"e3", fleet.ErrTransition}, {"e4", fleet.ErrTransition}}})
	if len(rec.Moves) != 0 || rec.Outcome != decisionlog.OutcomeBlocked || rec.SplitAfter != prop.SplitBefore {
		t.Fatalf("both refused: %+v", rec)
	}
	rec = Settled(prop, Ack{NotApplied: "the state could not be written"})
	if len(rec.Moves) != 0 || rec.Outcome != decisionlog.OutcomeBlocked || rec.SplitAfter != prop.SplitBefore ||
		rec.Reason != "repair; not applied: the state could not be written" {
		t.Fatalf("none applied: %+v", rec)
	}
	if prop.Reason != keep.Reason || prop.Outcome != keep.Outcome || prop.SplitAfter != keep.SplitAfter || !slices.Equal(prop.Moves, keep.Moves) {
		t.Fatalf("the proposal changed: %+v, was %+v", prop, keep)
	}
}
