package discovery

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func testFleet(t *testing.T) (*config.Config, *fleet.Fleet) {
	t.Helper()
	cfg := config.Default()
	cfg.Engines = []config.Engine{{ID: "c1", Address: "10.9.0.1:8000", Role: "prefill", Profile: config.DefaultProfileName}}
	f, err := fleet.New(cfg, t0)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, f
}

func ep(name, addr, role string) Endpoint {
	l := map[string]string{}
	if role != "" {
		l[config.LabelRole] = role
	}
	return Endpoint{Name: name, Address: addr, Labels: l}
}

func members(f *fleet.Fleet) []string {
	var out []string
	for _, e := range f.Snapshot().Engines {
		out = append(out, e.ID+"@"+e.Address+":"+e.Role.String())
	}
	return out
}

func TestReconcile(t *testing.T) {
	cfg, f := testFleet(t)
	s := NewSource("file", cfg)
	at := t0.Add(time.Second)

	res := s.Reconcile(f, []Endpoint{ep("p1", "10.0.0.1:8000", "prefill"), ep("d1", "10.0.0.2:8000", "decode"), ep("x1", "10.0.0.3:8000", "prefill-decode")}, at)
	if !slices.Equal(res.Added, []string{"p1", "d1", "x1"}) || len(res.Problems) != 0 {
		t.Fatalf("first list: %+v", res)
	}
	if x, _ := f.Engine("x1"); !x.RoleOpen || x.Source != "file" || x.Lifecycle != fleet.Recovering {
		t.Fatalf("x1 = %+v", x)
	}
	// The same list again changes nothing.
	v := f.Version()
	if res := s.Reconcile(f, []Endpoint{ep("p1", "10.0.0.1:8000", "prefill"), ep("d1", "10.0.0.2:8000", "decode"), ep("x1", "10.0.0.3:8000", "prefill-decode")}, at); res.Changed() || f.Version() != v {
		t.Fatalf("same list: %+v, version %d -> %d", res, v, f.Version())
	}
	// Narwhal moves d1 to prefill; the list still says decode: no change (the label did not).
	if _, err := f.SetRole("d1", fleet.Prefill, at, "decision 1"); err != nil {
		t.Fatal(err)
	}
	res = s.Reconcile(f, []Endpoint{ep("p1", "10.0.0.1:8000", "prefill"), ep("d1", "10.0.0.2:8000", "decode"), ep("x1", "10.0.0.3:8000", "")}, at)
	if res.Changed() {
		t.Fatalf("Narwhal's own move undone: %+v", res)
	}
	// An operator relabels p1 decode: taken, as an operator's move.
	var evs []fleet.Event
	f.OnChange(func(e fleet.Event) { evs = append(evs, e) })
	res = s.Reconcile(f, []Endpoint{ep("p1", "10.0.0.1:8000", "decode"), ep("d1", "10.0.0.2:8000", "decode"), ep("x1", "10.0.0.3:8000", "")}, at)
	if !slices.Equal(res.Moved, []string{"p1"}) || len(evs) != 1 || evs[0].Cause != "operator (file)" || evs[0].To != "decode" {
		t.Fatalf("operator relabel: %+v, events %+v", res, evs)
	}
	// d1 moves to a new address (leaves and joins), x1 goes, a bad label and an unknown profile
	// are refused with a reason, a config engine's name and address are not taken. A role
	// Narwhal does not place (llm-d's encode roles, one it does not know) is no engine; llm-d's
	// deprecated "both" is prefill-decode (issue 34: they were flagged, then given a role).
	bad := ep("b1", "10.0.0.5:8000", "decode")
	bad.Labels[config.LabelProfile] = "nope"
	res = s.Reconcile(f, []Endpoint{
		ep("p1", "10.0.0.1:8000", "decode"), ep("d1", "10.0.0.4:8000", "decode"), bad,
		ep("w1", "10.0.0.6:8000", "sideways"), ep("e1", "10.0.0.9:8000", "encode"), ep("y1", "10.0.0.10:8000", "both"),
		ep("c1", "10.0.0.7:8000", "decode"), ep("c2", "10.9.0.1:8000", "decode"),
		ep("p1", "10.0.0.8:8000", "decode"),
	}, at)
	if !slices.Equal(res.Removed, []string{"d1", "x1"}) || !slices.Equal(res.Added, []string{"d1", "y1"}) {
		t.Fatalf("changes: %+v", res)
	}
	if y, _ := f.Engine("y1"); !y.RoleOpen {
		t.Fatalf("y1 (both) = %+v: want its role left to the controller", y)
	}
	want := []string{`w1: label llm-d.ai/role="sideways": not a role Narwhal places`, `e1: label llm-d.ai/role="encode": not a role Narwhal places`,
		"p1: listed twice", `b1: engine.profile: unknown profile "nope"`, "c1: the fleet has an engine of that name from config", "c2: fleet: invalid transition: engine c2: address 10.9.0.1:8000 is engine c1's"}
	if len(res.Problems) != len(want) {
		t.Fatalf("problems %q", res.Problems)
	}
	for i, w := range want {
		if !strings.Contains(res.Problems[i], w) {
			t.Errorf("problem %d = %q, want %q", i, res.Problems[i], w)
		}
	}
	if got := members(f); !slices.Equal(got, []string{"c1@10.9.0.1:8000:prefill", "p1@10.0.0.1:8000:decode", "d1@10.0.0.4:8000:decode", "y1@10.0.0.10:8000:decode"}) {
		t.Fatalf("members %v", got)
	}
	// An empty list removes every engine of the source, and only those.
	res = s.Reconcile(f, nil, at)
	if got := members(f); !slices.Equal(got, []string{"c1@10.9.0.1:8000:prefill"}) || len(res.Removed) != 3 {
		t.Fatalf("after an empty list: %v (%+v)", got, res)
	}
}

// A profile named by an annotation counts when no label names one; a label wins.
func TestMemberProfile(t *testing.T) {
	cfg, _ := testFleet(t)
	cfg.Profiles["h200"] = cfg.Profiles[config.DefaultProfileName]
	s := NewSource("kubernetes", cfg)
	for _, tc := range []struct {
		labels, annotations map[string]string
		want                string
	}{
		{nil, nil, ""},
		{nil, map[string]string{config.LabelProfile: "h200"}, "h200"},
		{map[string]string{config.LabelProfile: config.DefaultProfileName}, map[string]string{config.LabelProfile: "h200"}, config.DefaultProfileName},
	} {
		e, err := s.Member(Endpoint{Name: "x", Address: "10.0.0.1:8000", Labels: tc.labels, Annotations: tc.annotations})
		want := tc.want
		if want == "" {
			want = cfg.DiscoveredProfile("")
		}
		if err != nil && want != "" || e.Profile != want {
			t.Errorf("%v %v: profile %q (%v), want %q", tc.labels, tc.annotations, e.Profile, err, want)
		}
	}
}

// An engine that joins without a profile label or annotation is reported, once, as placed with
// the default profile (issue 34: every pod silently took the built-in H200 curves).
func TestReconcileReportsUnprofiledEngines(t *testing.T) {
	cfg, f := testFleet(t)
	s := NewSource("kubernetes", cfg)
	labelled := ep("p1", "10.0.0.1:8000", "prefill")
	labelled.Labels[config.LabelProfile] = config.DefaultProfileName
	annotated := ep("p2", "10.0.0.2:8000", "prefill")
	annotated.Annotations = map[string]string{config.LabelProfile: config.DefaultProfileName}
	list := []Endpoint{labelled, annotated, ep("d1", "10.0.0.3:8000", "decode")}
	if res := s.Reconcile(f, list, t0); !slices.Equal(res.Unprofiled, []string{"d1"}) {
		t.Fatalf("unprofiled %v, want [d1]", res.Unprofiled)
	}
	if res := s.Reconcile(f, list, t0); len(res.Unprofiled) != 0 {
		t.Fatalf("reported again: %v", res.Unprofiled)
	}
}
