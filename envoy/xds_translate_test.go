package envoy

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/wire"
)

var xdsEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// engineSpec is one test engine: id, address, role, pinned.
type engineSpec struct {
	id, addr, role string
	pinned         bool
}

func newTestFleet(t testing.TB, specs ...engineSpec) *fleet.Fleet {
	t.Helper()
	cfg := config.Default()
	cfg.Engines = nil
	for _, s := range specs {
		cfg.Engines = append(cfg.Engines, config.Engine{ID: s.id, Address: s.addr, Role: s.role,
			Profile: config.DefaultProfileName, Pinned: s.pinned})
	}
	f, err := fleet.New(cfg, xdsEpoch)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// mixedFleet has every role, lifecycle and pin: e1 prefill active pinned, e2 decode draining,
// e3 decode failed, e4 prefill recovering, e5 decode active.
func mixedFleet(t testing.TB) *fleet.Fleet {
	t.Helper()
	f := newTestFleet(t,
		engineSpec{"e1", "10.0.0.1:8000", "prefill", true},
		engineSpec{"e2", "10.0.0.2:8000", "decode", false},
		engineSpec{"e3", "10.0.0.3:8000", "decode", false},
		engineSpec{"e4", "10.0.0.4:8000", "prefill", false},
		engineSpec{"e5", "10.0.0.5:8000", "decode", false},
	)
	mustEngine(t)(f.Drain("e2", xdsEpoch, "test", fleet.Floors{}))
	mustEngine(t)(f.SetLifecycle("e3", fleet.Failed, xdsEpoch, "test"))
	mustEngine(t)(f.SetLifecycle("e4", fleet.Failed, xdsEpoch, "test"))
	mustEngine(t)(f.SetLifecycle("e4", fleet.Recovering, xdsEpoch, "test"))
	return f
}

func mustEngine(t testing.TB) func(fleet.Engine, error) {
	return func(_ fleet.Engine, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// endpointView is what a test reads back from one LbEndpoint.
type endpointView struct {
	addr, role, id, lifecycle, lbRole string
	pinned                            bool
	health                            corev3.HealthStatus
}

func (v endpointView) String() string {
	return fmt.Sprintf("%s %s %s %s pinned=%v %s lb=%s", v.id, v.addr, v.role, v.lifecycle, v.pinned, v.health, v.lbRole)
}

func viewCLA(t testing.TB, cla *endpointv3.ClusterLoadAssignment) []endpointView {
	t.Helper()
	if n := len(cla.GetEndpoints()); n != 1 {
		t.Fatalf("%s: %d localities, want 1", cla.GetClusterName(), n)
	}
	loc := cla.GetEndpoints()[0]
	if l := loc.GetLocality(); l.GetRegion() == "" || l.GetZone() == "" || loc.GetLoadBalancingWeight().GetValue() == 0 {
		t.Fatalf("%s: locality %v weight %v: grpc-go needs region, zone and a weight", cla.GetClusterName(), l, loc.GetLoadBalancingWeight())
	}
	var out []endpointView
	for _, lbe := range loc.GetLbEndpoints() {
		sa := lbe.GetEndpoint().GetAddress().GetSocketAddress()
		md := lbe.GetMetadata().GetFilterMetadata()
		n := md[wire.MetadataNamespace].GetFields()
		if len(n) != 4 {
			t.Fatalf("%s: narwhal metadata %v, want 4 fields", cla.GetClusterName(), n)
		}
		if len(md) != 2 || len(md[wire.LBNamespace].GetFields()) != 1 {
			t.Fatalf("%s: metadata %v, want narwhal and envoy.lb {role}", cla.GetClusterName(), md)
		}
		out = append(out, endpointView{
			addr:      fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue()),
			role:      n["role"].GetStringValue(),
			id:        n["engine_id"].GetStringValue(),
			lifecycle: n["lifecycle"].GetStringValue(),
			pinned:    n["pinned"].GetBoolValue(),
			health:    lbe.GetHealthStatus(),
			lbRole:    md[wire.LBNamespace].GetFields()["role"].GetStringValue(),
		})
	}
	return out
}

// expectedViews is the contract's translation of a fleet snapshot, one cluster at a time.
func expectedViews(s *fleet.Snapshot, cluster int) []endpointView {
	var out []endpointView
	for _, e := range s.Engines {
		if cluster == 0 && e.Role != fleet.Prefill || cluster == 1 && e.Role != fleet.Decode {
			continue
		}
		h := map[fleet.Lifecycle]corev3.HealthStatus{fleet.Active: corev3.HealthStatus_HEALTHY,
			fleet.Draining: corev3.HealthStatus_DRAINING, fleet.Failed: corev3.HealthStatus_UNHEALTHY,
			fleet.Recovering: corev3.HealthStatus_UNHEALTHY}[e.Lifecycle]
		out = append(out, endpointView{addr: e.Addr, role: e.Role.String(), id: e.ID, lifecycle: e.Lifecycle.String(),
			pinned: e.Pinned, health: h, lbRole: e.Role.String()})
	}
	return out
}

func checkViews(t testing.TB, got, want []endpointView) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("endpoints\n got %v\nwant %v", got, want)
	}
}

func TestTranslate(t *testing.T) {
	f := mixedFleet(t)
	snap := f.Snapshot()
	r := Translate("narwhal", &snap)
	names := []string{"narwhal-prefill", "narwhal-decode", "narwhal-engines"}
	if r.FleetVersion != snap.Version || len(r.Clusters) != 3 || len(r.Assignments) != 3 || len(r.Skipped) != 0 {
		t.Fatalf("version %d, %d clusters, %d assignments, skipped %v", r.FleetVersion, len(r.Clusters), len(r.Assignments), r.Skipped)
	}
	for i, c := range r.Clusters {
		if err := c.ValidateAll(); err != nil {
			t.Fatalf("cluster %s: %v", c.GetName(), err)
		}
		if c.GetName() != names[i] || c.GetType() != clusterv3.Cluster_EDS || c.GetLbPolicy() != clusterv3.Cluster_ROUND_ROBIN ||
			c.GetEdsClusterConfig().GetEdsConfig().GetAds() == nil || c.GetConnectTimeout().AsDuration() != ConnectTimeout ||
			c.GetCommonLbConfig().GetHealthyPanicThreshold().GetValue() != 0 {
			t.Fatalf("cluster %d: %v", i, c)
		}
		if subset := c.GetLbSubsetConfig() != nil; subset != (i == 2) {
			t.Fatalf("cluster %s: subset load balancing %v (only the engines cluster has it)", c.GetName(), subset)
		}
	}
	for i, cla := range r.Assignments {
		if err := cla.ValidateAll(); err != nil {
			t.Fatalf("assignment %s: %v", cla.GetClusterName(), err)
		}
		if cla.GetClusterName() != names[i] {
			t.Fatalf("assignment %d is %s", i, cla.GetClusterName())
		}
		checkViews(t, viewCLA(t, cla), expectedViews(&snap, i))
	}
	// The mixed fleet covers every health status.
	got := fmt.Sprint(viewCLA(t, r.Assignments[2]))
	want := "[e1 10.0.0.1:8000 prefill active pinned=true HEALTHY lb=prefill " +
		"e2 10.0.0.2:8000 decode draining pinned=false DRAINING lb=decode " +
		"e3 10.0.0.3:8000 decode failed pinned=false UNHEALTHY lb=decode " +
		"e4 10.0.0.4:8000 prefill recovering pinned=false UNHEALTHY lb=prefill " +
		"e5 10.0.0.5:8000 decode active pinned=false HEALTHY lb=decode]"
	if got != want {
		t.Fatalf("engines\n got %s\nwant %s", got, want)
	}
}

// TestTranslateDeterministic: the same fleet gives byte-identical resources.
func TestTranslateDeterministic(t *testing.T) {
	a, b := mixedFleet(t).Snapshot(), mixedFleet(t).Snapshot()
	ra, rb := Translate("p", &a), Translate("p", &b)
	opts := proto.MarshalOptions{Deterministic: true}
	for i := range ra.Assignments {
		x, _ := opts.Marshal(ra.Assignments[i])
		y, _ := opts.Marshal(rb.Assignments[i])
		if string(x) != string(y) || !proto.Equal(ra.Clusters[i], rb.Clusters[i]) {
			t.Fatalf("resource %d differs between two translations of the same fleet", i)
		}
	}
}

// TestTranslateEmptyRole: a role with no engine still has its locality (and validates).
func TestTranslateEmptyRole(t *testing.T) {
	f := newTestFleet(t, engineSpec{"e1", "10.0.0.1:8000", "decode", false})
	snap := f.Snapshot()
	r := Translate("x", &snap)
	pre := r.Assignments[0]
	if err := pre.ValidateAll(); err != nil || len(pre.GetEndpoints()) != 1 || len(pre.GetEndpoints()[0].GetLbEndpoints()) != 0 {
		t.Fatalf("empty prefill assignment: %v (%v)", pre, err)
	}
}

// TestTranslateSkips: an unresolved host name, or a second engine on the same address, is left
// out of every assignment (either would make Envoy or grpc-go reject the whole assignment).
func TestTranslateSkips(t *testing.T) {
	f := newTestFleet(t,
		engineSpec{"e1", "10.0.0.1:8000", "prefill", false},
		engineSpec{"e2", "engine-2:8000", "decode", false},
		engineSpec{"e3", "10.0.0.3:8000", "decode", false},
		engineSpec{"e4", "10.0.0.4:8000", "decode", false},
	)
	ap := netip.MustParseAddrPort("10.0.0.1:8000")
	mustEngine(t)(f.SetAddr("e4", ap, xdsEpoch))
	snap := f.Snapshot()
	r := Translate("x", &snap)
	if got := fmt.Sprint(r.Skipped); got != "[{e2 engine-2:8000 address is not IP:port (not resolved yet)} {e4 10.0.0.1:8000 same address as engine e1}]" {
		t.Fatalf("skipped %s", got)
	}
	var ids []string
	for _, v := range viewCLA(t, r.Assignments[2]) {
		ids = append(ids, v.id)
	}
	if fmt.Sprint(ids) != "[e1 e3]" {
		t.Fatalf("engines assignment has %v", ids)
	}
}

// TestChangedAssignments: which assignments a fleet change touches.
func TestChangedAssignments(t *testing.T) {
	f := mixedFleet(t)
	cur := func() [3][]member {
		s := f.Snapshot()
		m, _ := fleetMembers(s.Engines)
		return splitMembers(m)
	}
	for _, tc := range []struct {
		name   string
		change func()
		want   [3]bool
	}{
		{"drain a decode engine", func() { mustEngine(t)(f.Drain("e5", xdsEpoch, "t", fleet.Floors{})) }, [3]bool{false, true, true}},
		{"undrain it (it stays draining)", func() { mustEngine(t)(f.Undrain("e5", xdsEpoch, "t")) }, [3]bool{}},
		{"pin a decode engine", func() { mustEngine(t)(f.SetPinned("e3", true, xdsEpoch, "t")) }, [3]bool{false, true, true}},
		{"move decode to prefill", func() { mustEngine(t)(f.SetRole("e5", fleet.Prefill, xdsEpoch, "t")) }, [3]bool{true, true, true}},
		{"recover a prefill engine", func() { mustEngine(t)(f.SetLifecycle("e4", fleet.Active, xdsEpoch, "t")) }, [3]bool{true, false, true}},
	} {
		before := cur()
		tc.change()
		if got := changedClusters(before, cur()); got != tc.want {
			t.Errorf("%s: changed %v, want %v", tc.name, got, tc.want)
		}
	}
}
