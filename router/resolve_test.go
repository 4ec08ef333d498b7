package router

import (
	"net/netip"
	"testing"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

// TestUnresolvedEngineTakesNoPlacement: headers and metadata must carry IP:port, so an engine
// whose configured host name is not resolved yet is not placed on.
func TestUnresolvedEngineTakesNoPlacement(t *testing.T) {
	cfg := config.Default()
	cfg.Engines = []config.Engine{
		{ID: "p", Address: "prefill.internal:8000", Role: "prefill", Profile: config.DefaultProfileName},
		{ID: "d", Address: "10.0.0.2:8000", Role: "decode", Profile: config.DefaultProfileName},
	}
	f, err := fleet.New(cfg, epoch)
	if err != nil {
		t.Fatal(err)
	}
	r := New(cfg, f.Snapshot(), epoch)
	// The prefill engine is not live: the decode engine serves as the aggregate fallback.
	if o := r.Offer(epoch, Offer{ID: "a", PromptTokens: 10}); o.Status != Dispatched || o.Placement.Kind != Aggregate || o.Placement.PrefillAddr != "10.0.0.2:8000" {
		t.Fatalf("placed on an unresolved engine: %+v", o)
	}
	if _, err := f.SetAddr("p", netip.MustParseAddrPort("10.0.0.1:8000"), epoch); err != nil {
		t.Fatal(err)
	}
	r.SetFleet(epoch, f.Snapshot())
	o := r.Offer(epoch, Offer{ID: "b", PromptTokens: 10})
	if o.Status != Dispatched || o.Placement.Kind != Disaggregated || o.Placement.PrefillAddr != "10.0.0.1:8000" {
		t.Fatalf("after resolution: %+v", o)
	}
}
