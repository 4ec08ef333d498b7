package controller

import (
	"math"
	"testing"
)

// One test per gate of docs/role-control.md section 7 that a move can fail, showing it blocking
// a move that is otherwise motivated and strictly improving, and one showing it passing in a
// move that is made (testdata/gates.d; the scripts print every gate with its detail). Three
// gates cannot fail by construction and have no test of their own: health_exclusions (donors are
// taken from the live pools), resident_ownership (it always holds: residents stay), and
// confirmation (a regular move's motive already needs confirm_passes); the allowing scripts
// print them passing with every other gate.

const (
	toPrefillAllows = "testdata/gates.d/to_prefill_allows" // a regular move toward prefill: every gate of its direction passes
	toDecodeAllows  = "testdata/gates.d/to_decode_allows"  // a regular move toward decode: every gate of its direction passes
)

func TestGate_Pins_Blocks(t *testing.T)  { runScript(t, "testdata/gates.d/pins_blocks") }
func TestGate_Pins_Allows(t *testing.T)  { runScript(t, toPrefillAllows) }
func TestGate_Dwell_Blocks(t *testing.T) { runScript(t, "testdata/gates.d/dwell_blocks") }
func TestGate_Dwell_Allows(t *testing.T) { runScript(t, toDecodeAllows) }
func TestGate_RoleFloors_Blocks(t *testing.T) {
	runScript(t, "testdata/gates.d/role_floors_blocks")
}
func TestGate_RoleFloors_Allows(t *testing.T) { runScript(t, toPrefillAllows) }
func TestGate_ProfileCoverage_Blocks(t *testing.T) {
	runScript(t, "testdata/gates.d/profile_coverage_blocks")
}
func TestGate_ProfileCoverage_Allows(t *testing.T) { runScript(t, toDecodeAllows) }
func TestGate_Cooldown_Blocks(t *testing.T)        { runScript(t, "testdata/gates.d/cooldown_blocks") }
func TestGate_Cooldown_Allows(t *testing.T)        { runScript(t, toDecodeAllows) }
func TestGate_ConsolidationEvidence_Blocks(t *testing.T) {
	runScript(t, "testdata/gates.d/consolidation_evidence_blocks")
}
func TestGate_ConsolidationEvidence_Allows(t *testing.T) { runScript(t, toPrefillAllows) }
func TestGate_DecodeStability_Blocks(t *testing.T) {
	runScript(t, "testdata/gates.d/decode_stability_blocks")
}
func TestGate_DecodeStability_Allows(t *testing.T) { runScript(t, toPrefillAllows) }
func TestGate_ConsolidationTrend_Blocks(t *testing.T) {
	runScript(t, "testdata/gates.d/consolidation_trend_blocks")
}
func TestGate_ConsolidationTrend_Allows(t *testing.T) { runScript(t, toPrefillAllows) }
func TestGate_DecodeCapacity_Blocks(t *testing.T) {
	runScript(t, "testdata/gates.d/decode_capacity_blocks")
}
func TestGate_DecodeCapacity_Allows(t *testing.T) { runScript(t, toPrefillAllows) }
func TestGate_FlipResidentGuard_Blocks(t *testing.T) {
	runScript(t, "testdata/gates.d/flip_resident_guard_blocks")
}
func TestGate_FlipResidentGuard_Allows(t *testing.T) { runScript(t, toPrefillAllows) }

// The first-token timeout that restarted the window does not count as one since it opened.
func TestGate_DecodeStability_AllowsAfterTimeout(t *testing.T) {
	runScript(t, "testdata/gates.d/decode_stability_after_timeout")
}

// A move that only flip_resident_guard blocks prepares its donor; the move follows once the
// donor's residents are within the guard.
func TestGate_FlipResidentGuard_PreparesTheDonor(t *testing.T) {
	runScript(t, "testdata/gates.d/flip_resident_guard_prepares")
}

// Section 11: a move of a donor that switches in place is judged with its drain weighed in —
// the split without it while it drains, then the candidate for the dwell it commits to.
func TestInPlaceWorst(t *testing.T) {
	for _, c := range []struct{ trans, target, drain, dwell, want float64 }{
		{2, 1, 0, 120, 1},                       // nothing to drain: the candidate
		{2, 1, 40, 120, (40*2 + 120*1) / 160.0}, // a 40 s drain at worst 2, then 120 s at 1
		{2, 1, 300, 120, 1.5},                   // a drain past the dwell: weighed as long
		{math.Inf(1), 1, 1, 120, math.Inf(1)},   // a split that cannot serve while it drains
	} {
		if got := inPlaceWorst(c.trans, c.target, c.drain, c.dwell); got != c.want {
			t.Errorf("inPlaceWorst(%v, %v, %v, %v) = %v, want %v", c.trans, c.target, c.drain, c.dwell, got, c.want)
		}
	}
}
