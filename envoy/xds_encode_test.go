package envoy

import (
	"bytes"
	"testing"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"

	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/wire"
)

// TestEncoderMatchesTranslate: the assignments the server publishes marshal to exactly the
// bytes of Translate's assignments, before and after changes (which reuse the encodings of
// the endpoints they did not change), and decode to valid, equal messages.
func TestEncoderMatchesTranslate(t *testing.T) {
	f := mixedFleet(t)
	enc := newEncoder()
	names := wire.Names("narwhal")
	check := func(step string) {
		t.Helper()
		snap := f.Snapshot()
		m, _ := fleetMembers(snap.Engines)
		got := enc.assignments(names, m, [3]bool{true, true, true})
		want := Translate("narwhal", &snap).Assignments
		if len(got) != 3 || len(enc.endpoints) != len(m) {
			t.Fatalf("%s: %d assignments, %d encoded endpoints for %d members", step, len(got), len(enc.endpoints), len(m))
		}
		for i := range want {
			gb, err := deterministicMarshal.Marshal(got[i])
			if err != nil {
				t.Fatal(err)
			}
			wb, _ := deterministicMarshal.Marshal(want[i])
			if !bytes.Equal(gb, wb) {
				t.Fatalf("%s: %s: published bytes differ from Translate's", step, want[i].GetClusterName())
			}
			back := &endpointv3.ClusterLoadAssignment{}
			if err := proto.Unmarshal(gb, back); err != nil || back.ValidateAll() != nil || !proto.Equal(back, want[i]) {
				t.Fatalf("%s: %s does not decode to Translate's assignment (%v)", step, want[i].GetClusterName(), err)
			}
		}
	}
	check("initial")
	mustEngine(t)(f.SetRole("e5", fleet.Prefill, xdsEpoch, "t"))
	check("role move")
	mustEngine(t)(f.SetPinned("e1", false, xdsEpoch, "t"))
	mustEngine(t)(f.SetLifecycle("e4", fleet.Active, xdsEpoch, "t"))
	check("unpin and recover")

	// Only the selected assignments are built.
	snap := f.Snapshot()
	m, _ := fleetMembers(snap.Engines)
	if got := enc.assignments(names, m, [3]bool{false, true, false}); len(got) != 1 || got[0].GetClusterName() != names.Decode {
		t.Fatalf("built %d assignments for one selected", len(got))
	}
}
