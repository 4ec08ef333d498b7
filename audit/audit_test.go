package audit

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

const head = `{"kind":"config","time_s":0,"controller":{"advisory":false,"min_prefill":1,"min_decode":1,"reactive":{"evidence_span_s":30,"evidence_min_arrivals":50,"evidence_max_span_s":120},"thresholds":{"cooldown_s":60,"dwell_s":120}},"slo":{"ttft_s":0.5,"tpot_s":0.05}}
{"kind":"fleet","time_s":0,"event":"snapshot","engines":[{"id":"e1","role":"prefill","lifecycle":"active","pinned":false},{"id":"e2","role":"decode","lifecycle":"active","pinned":false},{"id":"e3","role":"decode","lifecycle":"active","pinned":false},{"id":"e4","role":"decode","lifecycle":"active","pinned":false}]}
`

// A move toward prefill after the window closed, by the decision it names: clean.
const clean = head + `{"kind":"fleet","time_s":40,"event":"role","engine":"e4","from":"decode","to":"prefill","cause":"decision 1","decision":1}
{"kind":"decision","time_s":40,"seq":1,"caller":"regular","outcome":"moved","inputs":{"evidence_window":{"open":false,"opened_at_s":0,"arrivals":80}},"moves":[{"engine":"e4","from":"decode","to":"prefill"}]}
`

func audit(t *testing.T, log string) []Violation {
	t.Helper()
	res, err := Audit(strings.NewReader(log), nil)
	if err != nil {
		t.Fatal(err)
	}
	return res.Violations
}

func TestAuditClean(t *testing.T) {
	if v := audit(t, clean); len(v) != 0 {
		t.Fatalf("%v", v)
	}
}

// One hand-made bad log per invariant: the audit names the rule and the line.
func TestAuditFindsViolations(t *testing.T) {
	cases := []struct {
		rule, log string
		line      int
	}{
		{"pins", head + `{"kind":"fleet","time_s":10,"event":"pin","engine":"e4","pinned":true,"cause":"admin"}
` + move(40, 1, "e4", "decode", "prefill") + decision(40, 1, "regular", closed, mv("e4", "decode", "prefill")), 4},
		{"dwell", head + move(40, 1, "e4", "decode", "prefill") + decision(40, 1, "regular", closed, mv("e4", "decode", "prefill")) +
			move(100, 2, "e4", "prefill", "decode") + decision(100, 2, "regular", closed, mv("e4", "prefill", "decode")), 5},
		{"role_floors", head + move(10, 1, "e1", "prefill", "decode") + decision(10, 1, "regular", closed, mv("e1", "prefill", "decode")), 3},
		{"cooldown", head + move(40, 1, "e4", "decode", "prefill") + decision(40, 1, "regular", closed, mv("e4", "decode", "prefill")) +
			move(41, 2, "e3", "decode", "prefill") + decision(41, 2, "regular", closed, mv("e3", "decode", "prefill")) +
			move(200, 3, "e4", "prefill", "decode") + decision(200, 3, "regular", closed, mv("e4", "prefill", "decode")) +
			move(230, 4, "e3", "prefill", "decode") + decision(230, 4, "regular", closed, mv("e3", "prefill", "decode")), 10},
		{"one_move", head + move(40, 1, "e3", "decode", "prefill") + move(40, 1, "e4", "decode", "prefill") +
			decision(40, 1, "urgent", closed, mv("e3", "decode", "prefill"), mv("e4", "decode", "prefill")), 5},
		{"evidence_window", head + move(10, 1, "e4", "decode", "prefill") + decision(10, 1, "urgent", `{"opened_at_s":0,"arrivals":80}`, mv("e4", "decode", "prefill")), 4},
		{"advisory", strings.Replace(head, `"advisory":false`, `"advisory":true`, 1) + move(40, 1, "e4", "decode", "prefill") + decision(40, 1, "regular", closed, mv("e4", "decode", "prefill")), 3},
		{"orphan_role_change", head + `{"kind":"fleet","time_s":40,"event":"role","engine":"e4","from":"decode","to":"prefill","cause":"admin"}
`, 3},
		{"orphan_role_change", head + move(40, 7, "e4", "decode", "prefill"), 3},
	}
	for _, c := range cases {
		t.Run(c.rule, func(t *testing.T) {
			v := audit(t, c.log)
			if len(v) == 0 {
				t.Fatal("no violation found")
			}
			for _, x := range v {
				if x.Rule == c.rule && x.Line == c.line {
					return
				}
			}
			t.Fatalf("want %s at line %d, got %v", c.rule, c.line, v)
		})
	}
}

// The logs of two replicas, audited as one on their wall clocks: a takes e4 to prefill at its
// 40 s and dies; b (started 100 s after a) takes over and moves e4 back at its 50 s — 110 s after
// a's move, inside the 120 s dwell — numbering its decision as a's. Each log alone is clean;
// merged, the dwell and the reused number show, at b's lines and on a's clock.
func TestAuditMergesReplicaLogs(t *testing.T) {
	epoch := func(log string, unix string) string {
		return strings.Replace(log, `"time_s":0,"controller"`, `"time_s":0,"epoch_unix_s":`+unix+`,"controller"`, 1)
	}
	a := epoch(head, "1000") + move(40, 1, "e4", "decode", "prefill") + decision(40, 1, "regular", closed, mv("e4", "decode", "prefill"))
	standby := strings.Replace(strings.SplitAfter(head, "\n")[1], `"e4","role":"decode"`, `"e4","role":"prefill"`, 1) // b's view of a's state
	takeover := strings.Replace(standby, `"time_s":0`, `"time_s":45`, 1)
	b := epoch(strings.SplitAfter(head, "\n")[0], "1100") + standby + takeover +
		move(50, 1, "e4", "prefill", "decode") + decision(50, 1, "regular", closed, mv("e4", "prefill", "decode"))
	for name, log := range map[string]string{"a": a, "b": b} {
		if v := audit(t, log); len(v) != 0 {
			t.Fatalf("%s alone: %v", name, v)
		}
	}
	res, err := AuditLogs([]Log{{"a.jsonl", strings.NewReader(a)}, {"b.jsonl", strings.NewReader(b)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, v := range res.Violations {
		got = append(got, v.String())
	}
	want := []string{
		"b.jsonl line 4 (150.000s): dwell: e4 moved 110.000s after its last role change (dwell 120s)",
		"b.jsonl line 5 (150.000s): sequence: decision 1 follows decision 1 (a.jsonl line 4): a decision numbered again",
	}
	if !slices.Equal(got, want) || res.Lines != 9 || res.Decisions != 2 || res.RoleChanges != 2 {
		t.Fatalf("merged: %+v\n%q", res, got)
	}

	// a's last decision was not persisted (its store refused the write): b numbering its first
	// decision as that one is no violation; numbering it as a persisted one is.
	unpersisted := a + `{"kind":"decision","time_s":45,"seq":2,"caller":"regular","outcome":"blocked","moves":[],"not_persisted":true}` + "\n"
	for _, c := range []struct {
		seq  int
		want bool
	}{{2, false}, {1, true}} {
		bn := b
		if c.seq == 2 {
			bn = strings.Replace(b, `"cause":"decision 1","decision":1`, `"cause":"decision 2","decision":2`, 1)
			bn = strings.Replace(bn, `"time_s":50,"seq":1`, `"time_s":50,"seq":2`, 1)
		}
		res, err := AuditLogs([]Log{{"a.jsonl", strings.NewReader(unpersisted)}, {"b.jsonl", strings.NewReader(bn)}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := slices.ContainsFunc(res.Violations, func(v Violation) bool { return v.Rule == "sequence" })
		if got != c.want {
			t.Errorf("b's decision %d after a's unpersisted decision 2: sequence violation %t, want %t (%v)", c.seq, got, c.want, res.Violations)
		}
	}

	// Logs that cannot be one fleet's, or merged at all: an error naming the log.
	if _, err := AuditLogs([]Log{{"a.jsonl", strings.NewReader(a)}, {"old.jsonl", strings.NewReader(head)}}, nil); err == nil ||
		!strings.Contains(err.Error(), "old.jsonl: no config line with epoch_unix_s") {
		t.Fatalf("no epoch: %v", err)
	}
	other := strings.Replace(b, `"dwell_s":120`, `"dwell_s":10`, 1)
	if _, err := AuditLogs([]Log{{"a.jsonl", strings.NewReader(a)}, {"b.jsonl", strings.NewReader(other)}}, nil); err == nil ||
		!strings.Contains(err.Error(), "b.jsonl: line 1: its controller config differs") {
		t.Fatalf("other config: %v", err)
	}
}

// A malformed log is an error naming its line.
func TestAuditBadLog(t *testing.T) {
	_, err := Audit(strings.NewReader(head+"{not json\n"), nil)
	if err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("%v", err)
	}
	if _, err := Audit(strings.NewReader(`{"kind":"decision","seq":1}`+"\n"), nil); err == nil {
		t.Fatal("a log without config and snapshot passed")
	}
	// A role or a lifecycle the fleet does not have is a bad log, named with its line.
	for _, bad := range []string{
		move(1, 1, "e1", "prefill", "verify"),
		`{"kind":"fleet","time_s":1,"event":"lifecycle","engine":"e1","from":"active","to":"sleeping","cause":"health"}` + "\n",
	} {
		if _, err := Audit(strings.NewReader(head+bad), nil); err == nil || !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), "unknown") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// move, decision and mv write log lines; closed is an evidence window that has closed.
func move(t float64, seq int, engine, from, to string) string {
	return `{"kind":"fleet","time_s":` + f(t) + `,"event":"role","engine":"` + engine + `","from":"` + from + `","to":"` + to + `","cause":"decision ` + itoa(seq) + `","decision":` + itoa(seq) + "}\n"
}

func decision(t float64, seq int, caller string, window string, moves ...string) string {
	return `{"kind":"decision","time_s":` + f(t) + `,"seq":` + itoa(seq) + `,"caller":"` + caller + `","outcome":"moved","inputs":{"evidence_window":` + window + `},"moves":[` + strings.Join(moves, ",") + "]}\n"
}

func mv(engine, from, to string) string {
	return `{"engine":"` + engine + `","from":"` + from + `","to":"` + to + `"}`
}

const closed = `{"opened_at_s":0,"arrivals":80}`

func f(x float64) string { return strings.TrimRight(strings.TrimRight(strconvF(x), "0"), ".") }

func strconvF(x float64) string { return strconv.FormatFloat(x, 'f', 3, 64) }
func itoa(n int) string         { return strconv.Itoa(n) }

// Section 11, engines that switch in place: a clean switch audits clean; a switch asked twice,
// a role change no successful switch made, a failed switch that does not fail its engine, a
// decision whose switch method its role change contradicts, and a switch that leaves a floor
// broken are each found.
func TestAuditInPlaceSwitches(t *testing.T) {
	ev := func(tm float64, engine, event, from, to string, extra string) string {
		return `{"kind":"fleet","time_s":` + f(tm) + `,"event":"` + event + `","engine":"` + engine + `","from":"` + from + `","to":"` + to + `"` + extra + "}\n"
	}
	hold := ev(40, "e4", "lifecycle", "active", "switching", `,"cause":"decision 1"`)
	dec := func(sw string) string {
		return `{"kind":"decision","time_s":40,"seq":1,"caller":"regular","switch":"` + sw + `","outcome":"moved","inputs":{"evidence_window":{"opened_at_s":0,"arrivals":80}},"moves":[{"engine":"e4","from":"decode","to":"prefill"}]}` + "\n"
	}
	asked := ev(41, "e4", "switch", "decode", "prefill", `,"result":"asked"`)
	ok := ev(42, "e4", "switch", "decode", "prefill", `,"result":"succeeded"`)
	role := ev(42, "e4", "role", "decode", "prefill", `,"cause":"decision 1","decision":1`)
	active := ev(42, "e4", "lifecycle", "switching", "active", `,"cause":"switch"`)
	clean := head + hold + dec("sglang") + asked + ok + role + active
	if v := audit(t, clean); len(v) != 0 {
		t.Fatalf("a clean switch: %v", v)
	}
	failed := ev(42, "e4", "switch", "decode", "prefill", `,"result":"failed"`)
	for _, c := range []struct {
		name, log, detail string
	}{
		{"asked twice", head + hold + dec("sglang") + asked + asked + ok + role + active, "asked to switch while switching (asked before: true)"},
		{"role without a switch", head + hold + dec("sglang") + asked + role + active, "changed role while held for a switch"},
		{"a failed switch, then active", head + hold + dec("sglang") + asked + failed + active, "became active after its switch failed"},
		{"routing decision, switched", head + hold + dec("routing") + asked + ok + role + active, `by a successful in-place switch for decision 1, whose switch is "routing"`},
		{"sglang decision, routed", head + dec("sglang") + role, `by routing alone for decision 1, whose switch is "sglang"`},
		{"the floor", head + ev(40, "e1", "lifecycle", "active", "switching", `,"cause":"decision 1"`), "e1 left prefill to switch in place: 0 live prefill engines, floor 1"},
	} {
		v := audit(t, c.log)
		found := false
		for _, x := range v {
			found = found || strings.Contains(x.Detail, c.detail)
		}
		if !found {
			t.Errorf("%s: %v, want %q", c.name, v, c.detail)
		}
	}
}

// Engines that join and leave: an added engine is known from its event on (recovering, in the
// event's role), a removed one no longer counts toward the floors; an operator's relabel is no
// decision of the controller's, and the controller's dwell counts from it.
func TestAuditMembership(t *testing.T) {
	log := head + `{"kind":"fleet","time_s":5,"event":"added","engine":"k1","to":"decode","cause":"kubernetes","address":"10.0.0.9:8000","profile":"p"}
{"kind":"fleet","time_s":6,"event":"lifecycle","engine":"k1","from":"recovering","to":"active","cause":"health"}
{"kind":"fleet","time_s":7,"event":"role","engine":"k1","from":"decode","to":"prefill","cause":"operator (kubernetes)","caller":"operator"}
{"kind":"fleet","time_s":8,"event":"removed","engine":"e1","from":"prefill","cause":"kubernetes"}
` + move(40, 1, "e4", "decode", "prefill") + decision(40, 1, "regular", closed, mv("e4", "decode", "prefill"))
	res, err := Audit(strings.NewReader(log), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Violations) != 0 || res.OperatorMoves != 1 || res.RoleChanges != 2 {
		t.Fatalf("%+v", res)
	}
	// The controller moving k1 back 20 s after the operator: inside dwell.
	v := audit(t, log+move(60, 2, "k1", "prefill", "decode")+decision(60, 2, "regular", closed, mv("k1", "prefill", "decode")))
	if len(v) == 0 || !slices.ContainsFunc(v, func(x Violation) bool { return x.Rule == "dwell" }) {
		t.Fatalf("a controller move inside the operator's dwell: %v", v)
	}
	for _, bad := range []string{
		head + `{"kind":"fleet","time_s":5,"event":"removed","engine":"zz","from":"decode","cause":"file"}` + "\n",
		head + `{"kind":"fleet","time_s":5,"event":"added","engine":"e1","to":"decode","cause":"file"}` + "\n",
		head + `{"kind":"fleet","time_s":8,"event":"removed","engine":"e1","from":"prefill","cause":"file"}` + "\n" +
			`{"kind":"fleet","time_s":9,"event":"lifecycle","engine":"e1","from":"active","to":"failed","cause":"health"}` + "\n",
	} {
		if _, err := Audit(strings.NewReader(bad), nil); err == nil {
			t.Errorf("accepted\n%s", bad)
		}
	}
}
