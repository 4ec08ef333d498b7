package sim

import (
	"fmt"
	"testing"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

// The threshold planner's move rule on measured loads (1 = at the SLO), apart from its measure.
func TestPlannerDecide(t *testing.T) {
	pool := func(kv ...any) plannerPool {
		var pl plannerPool
		for i := 0; i < len(kv); i += 2 {
			pl.ids, pl.loads = append(pl.ids, kv[i].(string)), append(pl.loads, kv[i+1].(float64))
		}
		return pl
	}
	for _, tc := range []struct {
		name     string
		pre, dec plannerPool
		borrowed map[string]fleet.Role
		want     string // "" for no move, else "engine->role"
	}{
		{"every prefill engine over: the lightest decode engine moves", pool("p1", 1.2, "p2", 1.5), pool("d1", 0.4, "d2", 0.3, "d3", 0.9), nil, "d2->prefill"},
		{"one prefill engine within the SLO: no move", pool("p1", 1.2, "p2", 0.9), pool("d1", 0.4, "d2", 0.3), nil, ""},
		{"every decode engine over: the lightest prefill engine moves", pool("p1", 0.2, "p2", 0.1, "p3", 0.5), pool("d1", 1.1), nil, "p2->decode"},
		{"the donor pool at its floor: no move", pool("p1", 1.2, "p2", 1.5), pool("d1", 0.1), nil, ""},
		{"a tie: the first id", pool("p1", 2.0), pool("d2", 0.3, "d1", 0.3), nil, "d1->prefill"},
		{"a borrowed engine goes back once its pool can shrink", pool("p1", 0.2, "d9", 0.2), pool("d1", 0.5), map[string]fleet.Role{"d9": fleet.Prefill}, "d9->decode"},
		{"not while the pool cannot shrink (mean × N/(N−1) ≥ 0.8)", pool("p1", 0.5, "d9", 0.4), pool("d1", 0.5), map[string]fleet.Role{"d9": fleet.Prefill}, ""},
		{"nothing borrowed: nothing goes back", pool("p1", 0.1, "p2", 0.1), pool("d1", 0.5), nil, ""},
		{"an empty pool is not overloaded", pool(), pool("d1", 0.5, "d2", 0.5), nil, ""},
	} {
		p := newPlanner(config.Default())
		for id, r := range tc.borrowed {
			p.borrowed[id] = r
		}
		got := ""
		if ms := p.decide(tc.pre, tc.dec); len(ms) == 1 {
			got = fmt.Sprintf("%s->%s", ms[0].Engine, ms[0].to)
		} else if len(ms) > 1 {
			got = fmt.Sprint(ms)
		}
		if got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
