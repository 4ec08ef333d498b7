package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// poolView prices a split as a prefill pool that serves its load in proportion to its size,
// after a fixed part no engine shortens (one prompt's own prefill): a ttft_ratio of
// fixed + load/P, and a decode pool far within its SLO.
type poolView struct {
	fixed, load float64
	overload    float64 // every split's decode overload
	// byDecode prices the load over the decode pool instead (first tokens held by a decode pool
	// short of room, or brought sooner by its local prefill).
	byDecode bool
	ttft     map[int]float64 // when set, the ttft_ratio of a split by its prefill engines
	engines  []string
	loads    map[string]router.EngineLoad // by id; others idle
}

func (v poolView) Price(_ time.Time, q router.Query) ([]router.Pricing, bool) {
	ps := make([]router.Pricing, len(q.Splits))
	for i, s := range q.Splits {
		pool := len(s.Prefill)
		if v.byDecode {
			pool = len(s.Decode)
		}
		ttft := v.fixed + v.load/float64(pool)
		if v.ttft != nil {
			ttft = v.ttft[len(s.Prefill)]
		}
		ps[i] = router.Pricing{TTFTRatio: ttft, TPOTRatio: 0.1, Worst: ttft, Overload: max(v.overload, 0.1)}
	}
	return ps, true
}

func (v poolView) Snapshot(time.Time) router.Snapshot {
	s := router.Snapshot{Counters: router.Counters{Admitted: 1000}}
	for _, id := range v.engines {
		l := v.loads[id]
		l.ID = id
		s.Engines = append(s.Engines, l)
	}
	return s
}

func (poolView) FirstTokenTimeoutAt() (time.Time, bool) { return time.Time{}, false }

// TestGainScalesWithThePool: one engine added to a pool of n lowers a ratio of v by about v/n,
// under min_gain on a large fleet at any pressure a backlog reaches. The gain that counts is
// min_gain, or half of one engine's share when that is less (docs/role-control.md section 5):
// a 37P/3D fleet at prefill pressure 1.689 moves for the 0.044 that 38P/2D gives, not for 0.005
// (under 1.689/76), and a 3P/1D fleet does not move for 0.04 (under min_gain).
func TestGainScalesWithThePool(t *testing.T) {
	for _, tc := range []struct {
		prefill, decode int
		fixed, load     float64
		want            string
	}{
		{37, 3, 0, 37 * 1.689, "moved: to_prefill: worst 1.689 -> 1.645"},
		{37, 3, 1.5, 37 * 0.189, "retained: motivated ([to_prefill]) but no adjacent split strictly improves worst 1.689 by more than its gain (to_prefill 0.0222, to_decode 0.05)"},
		{3, 1, 1.529, 3 * 0.16, "retained: motivated ([to_prefill]) but no adjacent split strictly improves worst 1.689 by more than 0.05"},
	} {
		t.Run(fmt.Sprintf("%dP/%dD+%g", tc.prefill, tc.decode, tc.fixed), func(t *testing.T) {
			d := firstRegularPass(t, tc.prefill, tc.decode, poolView{fixed: tc.fixed, load: tc.load})
			if got := fmt.Sprintf("%s: %s", d.Outcome, d.Reason); !strings.HasPrefix(got, tc.want) {
				t.Fatalf("decision %d: %s, want %s…", d.Seq, got, tc.want)
			}
		})
	}
}

// TestPressureRelievedTowardDecode: prefill pressure that one more decode engine relieves (the
// ratio priced over the decode pool) motivates the move toward decode, which waits for
// confirm_passes passes of that pressure as any move toward decode does (docs/role-control.md
// section 5, "Relieved the other way"). Before, only a move toward prefill was motivated, none
// improved, and the 2P/2D fleet never moved.
func TestPressureRelievedTowardDecode(t *testing.T) {
	ds := regularPasses(t, 2, 2, poolView{load: 2 * 1.5, byDecode: true}, 3)
	want := []string{
		"blocked: to_decode: worst 1.500 -> 1.000 (prefill pressure relieved: ttft_ratio 1.500 -> 1.000); blocked by confirmation",
		"blocked: to_decode: worst 1.500 -> 1.000 (prefill pressure relieved: ttft_ratio 1.500 -> 1.000); blocked by confirmation",
		"moved: to_decode: worst 1.500 -> 1.000 (prefill pressure relieved: ttft_ratio 1.500 -> 1.000)",
	}
	for i, d := range ds {
		if got := fmt.Sprintf("%s: %s", d.Outcome, d.Reason); got != want[i] {
			t.Errorf("regular pass %d (decision %d): %s, want %s", i+1, d.Seq, got, want[i])
		}
	}
}

// TestPressureRelievedTheUsualWayFirst: when the move prefill pressure asks (toward prefill)
// improves, it is made, even where the move the other way would improve more: that one waits
// for its confirmation, and chosen first it held the usual move back for as long.
func TestPressureRelievedTheUsualWayFirst(t *testing.T) {
	d := firstRegularPass(t, 2, 2, poolView{ttft: map[int]float64{1: 1.0, 2: 1.5, 3: 1.2}})
	if got, want := fmt.Sprintf("%s: %s", d.Outcome, d.Reason), "moved: to_prefill: worst 1.500 -> 1.200"; got != want {
		t.Fatalf("decision %d: %s, want %s", d.Seq, got, want)
	}
}

// firstRegularPass runs a controller at the defaults (evidence at once) on a fleet of prefill
// engines e1… then decode engines, priced by v, up to its first regular pass, and returns it.
func firstRegularPass(t *testing.T, prefill, decode int, v poolView) decisionlog.Decision {
	t.Helper()
	return regularPasses(t, prefill, decode, v, 1)[0]
}

// regularPasses is firstRegularPass for the first n regular passes.
func regularPasses(t *testing.T, prefill, decode int, v poolView, n int) []decisionlog.Decision {
	t.Helper()
	cfg := config.Default()
	cfg.Controller.Reactive.EvidenceMinArrivals = 0
	cfg.Controller.Reactive.EvidenceSpanS = 0.1
	for i := range prefill + decode {
		role := "prefill"
		if i >= prefill {
			role = "decode"
		}
		id := fmt.Sprintf("e%d", i+1)
		v.engines = append(v.engines, id)
		cfg.Engines = append(cfg.Engines, config.Engine{ID: id, Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Role: role, Profile: config.DefaultProfileName})
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	fl, err := fleet.New(cfg, epoch)
	if err != nil {
		t.Fatal(err)
	}
	c := New(cfg, epoch)
	var ds []decisionlog.Decision
	for range 10 * n {
		d, ok := c.Tick(c.NextDeadline(), fl.Snapshot(), v)
		if !ok { // a monitor pass with nothing to do
			continue
		}
		c.Applied(d) // the fleet stays as it was: a test of several passes ends at its first move
		if d.Caller != decisionlog.CallerRegular {
			continue
		}
		if ds = append(ds, d); len(ds) == n {
			return ds
		}
	}
	t.Fatalf("%d regular passes in %d deadlines, want %d", len(ds), 10*n, n)
	return nil
}

// TestHeldDonor: a move toward prefill that no candidate improves, every decode engine still
// decoding past the horizon (step_s 5), prepares the donor — the lightest, or the engine already
// prepared while it drains — and only while the decode pool without it has room
// (docs/role-control.md section 7, "A donor held by its residents").
func TestHeldDonor(t *testing.T) {
	for _, tc := range []struct {
		name     string
		overload float64
		loads    map[string]router.EngineLoad
		want     string // the prepared engine, or ""
	}{
		{"the lightest donor", 0, map[string]router.EngineLoad{
			"e3": {DecodeResidents: 2, DrainS: 40}, "e4": {DecodeResidents: 1, DrainS: 30}}, "e4"},
		{"the prepared engine stays", 0, map[string]router.EngineLoad{
			"e3": {DecodeResidents: 2, DrainS: 40, Prepared: true}, "e4": {DecodeResidents: 1, DrainS: 30}}, "e3"},
		{"a prepared engine drained is no reason", 0, map[string]router.EngineLoad{
			"e3": {DecodeResidents: 2, DrainS: 4, Prepared: true}, "e4": {DecodeResidents: 1, DrainS: 30}}, "e4"},
		{"a donor that drains within the horizon", 0, map[string]router.EngineLoad{
			"e3": {DecodeResidents: 2, DrainS: 40}, "e4": {DecodeResidents: 1, DrainS: 3}}, ""},
		{"no room elsewhere", 0.95, map[string]router.EngineLoad{
			"e3": {DecodeResidents: 2, DrainS: 40}, "e4": {DecodeResidents: 1, DrainS: 30}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// 2P/2D at prefill pressure 1.5, one engine more gaining 0.01: no candidate improves.
			d := firstRegularPass(t, 2, 2, poolView{fixed: 1.48, load: 0.04, overload: tc.overload, loads: tc.loads})
			if d.Outcome != decisionlog.OutcomeRetained || d.Prepare != tc.want {
				t.Fatalf("decision %d: %s (%s), prepare %q, want retained, prepare %q", d.Seq, d.Outcome, d.Reason, d.Prepare, tc.want)
			}
		})
	}
}
