package audit

import (
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
	move := func(t float64, seq int, engine, from, to string) string {
		return `{"kind":"fleet","time_s":` + f(t) + `,"event":"role","engine":"` + engine + `","from":"` + from + `","to":"` + to + `","cause":"decision ` + itoa(seq) + `","decision":` + itoa(seq) + "}\n"
	}
	decision := func(t float64, seq int, caller string, window string, moves ...string) string {
		return `{"kind":"decision","time_s":` + f(t) + `,"seq":` + itoa(seq) + `,"caller":"` + caller + `","outcome":"moved","inputs":{"evidence_window":` + window + `},"moves":[` + strings.Join(moves, ",") + "]}\n"
	}
	mv := func(engine, from, to string) string {
		return `{"engine":"` + engine + `","from":"` + from + `","to":"` + to + `"}`
	}
	closed := `{"opened_at_s":0,"arrivals":80}`
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

// A malformed log is an error naming its line.
func TestAuditBadLog(t *testing.T) {
	_, err := Audit(strings.NewReader(head+"{not json\n"), nil)
	if err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("%v", err)
	}
	if _, err := Audit(strings.NewReader(`{"kind":"decision","seq":1}`+"\n"), nil); err == nil {
		t.Fatal("a log without config and snapshot passed")
	}
}

func f(x float64) string { return strings.TrimRight(strings.TrimRight(strconvF(x), "0"), ".") }

func strconvF(x float64) string { return strconv.FormatFloat(x, 'f', 3, 64) }
func itoa(n int) string         { return strconv.Itoa(n) }
