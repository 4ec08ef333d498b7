package fleet

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/internal/poll"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func testConfig() *config.Config {
	c := config.Default()
	c.Engines = []config.Engine{
		{ID: "e1", Address: "127.0.0.1:8001", Role: "prefill", Profile: config.DefaultProfileName},
		{ID: "e2", Address: "127.0.0.1:8002", Role: "decode", Profile: config.DefaultProfileName},
		{ID: "e3", Address: "engine-3:8003", Role: "decode", Profile: config.DefaultProfileName, Pinned: true},
	}
	return c
}

func newFleet(t *testing.T) *Fleet {
	t.Helper()
	f, err := New(testConfig(), t0)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestNew(t *testing.T) {
	f := newFleet(t)
	s := f.Snapshot()
	if s.Version != 1 || len(s.Engines) != 3 {
		t.Fatalf("version %d, %d engines", s.Version, len(s.Engines))
	}
	if p, d := s.Split(); p != 1 || d != 2 {
		t.Fatalf("split %d/%d, want 1/2", p, d)
	}
	e, _ := s.Find("e3")
	if e.Role != Decode || !e.Pinned || e.Lifecycle != Active || !e.RoleSince.Equal(t0) || e.Addr != "engine-3:8003" {
		t.Fatalf("e3 = %+v", e)
	}
	bad := testConfig()
	bad.Engines[1].Role = "aggregate"
	if _, err := New(bad, t0); err == nil {
		t.Fatal("New accepted role aggregate")
	}
	bad = testConfig()
	bad.Engines[1].ID = "e1"
	if _, err := New(bad, t0); err == nil {
		t.Fatal("New accepted a duplicate id")
	}
}

func TestLifecycleTransitions(t *testing.T) {
	all := Lifecycles[:]
	allowed := map[[2]Lifecycle]bool{
		{Active, Draining}: true, {Active, Failed}: true,
		{Draining, Recovering}: true, {Draining, Failed}: true,
		{Recovering, Active}: true, {Recovering, Failed}: true, {Recovering, Draining}: true,
		{Failed, Recovering}: true, {Failed, Draining}: true,
		{Active, Switching}: true, {Switching, Active}: true, {Switching, Failed}: true, {Switching, Draining}: true,
	}
	for _, from := range all {
		for _, to := range all {
			if got := from.CanBecome(to); got != allowed[[2]Lifecycle{from, to}] {
				t.Errorf("%s.CanBecome(%s) = %v", from, to, got)
			}
		}
	}
	f := newFleet(t)
	if _, err := f.SetLifecycle("e1", Recovering, t0, "test"); !errors.Is(err, ErrTransition) {
		t.Fatalf("active -> recovering: err %v, want ErrTransition", err)
	}
	if v := f.Version(); v != 1 {
		t.Fatalf("a refused transition changed the version to %d", v)
	}
	e, err := f.SetLifecycle("e1", Failed, t0.Add(time.Second), "health")
	if err != nil || e.Lifecycle != Failed || !e.LifecycleSince.Equal(t0.Add(time.Second)) {
		t.Fatalf("active -> failed: %+v, %v", e, err)
	}
	if _, err := f.SetLifecycle("nope", Failed, t0, "x"); !errors.Is(err, ErrUnknownEngine) {
		t.Fatalf("unknown engine: %v", err)
	}
}

func TestDrainUndrain(t *testing.T) {
	f := newFleet(t)
	var events []Event
	f.OnChange(func(ev Event) { events = append(events, ev) })
	e, err := f.Drain("e2", t0.Add(time.Second), "admin", Floors{})
	if err != nil || e.Lifecycle != Draining || !e.Held {
		t.Fatalf("drain: %+v %v", e, err)
	}
	if f.Version() != 2 || len(events) != 2 || events[0].Kind != EventLifecycle || events[1].Kind != EventHold || events[0].Version != 2 {
		t.Fatalf("one drain must be one version with two events, got version %d, events %+v", f.Version(), events)
	}
	// A second drain changes nothing; the health monitor cannot move a held engine.
	if _, err := f.Drain("e2", t0, "admin", Floors{}); err != nil || f.Version() != 2 {
		t.Fatalf("second drain: %v, version %d", err, f.Version())
	}
	if _, err := f.SetLifecycle("e2", Recovering, t0, "health"); !errors.Is(err, ErrTransition) {
		t.Fatalf("health moved a held engine: %v", err)
	}
	e, err = f.Undrain("e2", t0.Add(2*time.Second), "admin")
	if err != nil || e.Held || e.Lifecycle != Draining {
		t.Fatalf("undrain: %+v %v (the engine stays draining until the health monitor readmits it)", e, err)
	}
	if _, err := f.Undrain("e2", t0, "admin"); !errors.Is(err, ErrTransition) {
		t.Fatalf("undrain of an engine not drained: %v", err)
	}
	// A failed engine can be drained, and stays failed-then-drained.
	if _, err := f.SetLifecycle("e1", Failed, t0, "health"); err != nil {
		t.Fatal(err)
	}
	if e, err := f.Drain("e1", t0, "admin", Floors{}); err != nil || e.Lifecycle != Draining {
		t.Fatalf("drain a failed engine: %+v %v", e, err)
	}
}

// A drain that would leave a role under its floor is refused and changes nothing; engines that
// are not live neither count toward the floor nor are held to it.
func TestDrainKeepsTheFloors(t *testing.T) {
	f := newFleet(t) // e1 prefill; e2, e3 decode
	floors := Floors{Prefill: 1, Decode: 2}
	var fe *FloorError
	if _, err := f.Drain("e1", t0, "admin", floors); !errors.Is(err, ErrFloor) || !errors.As(err, &fe) ||
		fe.Engine != "e1" || fe.Role != Prefill || fe.Left != 0 || fe.Floor != 1 {
		t.Fatalf("drain of the only prefill engine: %v (%+v)", err, fe)
	}
	if _, err := f.Drain("e2", t0, "admin", floors); !errors.Is(err, ErrFloor) {
		t.Fatalf("drain of one of two decode engines at a floor of two: %v", err)
	}
	if e := f.Snapshot().Engines[0]; f.Version() != 1 || e.Lifecycle != Active || e.Held {
		t.Fatalf("a refused drain changed the fleet: version %d, %+v", f.Version(), e)
	}
	if _, err := f.Drain("e2", t0, "admin", Floors{Prefill: 1, Decode: 1}); err != nil {
		t.Fatalf("drain leaving one decode engine at a floor of one: %v", err)
	}
	if _, err := f.Drain("e3", t0, "admin", Floors{Prefill: 1, Decode: 1}); !errors.Is(err, ErrFloor) {
		t.Fatalf("drain of the last live decode engine: %v", err)
	}
	if _, err := f.Drain("e2", t0, "admin", floors); err != nil {
		t.Fatalf("a held engine's second drain: %v", err)
	}
	// A failed engine is out of the pool already: draining it takes nothing from the floor.
	if _, err := f.SetLifecycle("e1", Failed, t0, "health"); err != nil {
		t.Fatal(err)
	}
	if e, err := f.Drain("e1", t0, "admin", floors); err != nil || !e.Held {
		t.Fatalf("drain of a failed engine: %+v %v", e, err)
	}
	// Zero floors force it.
	if e, err := f.Drain("e3", t0, "admin", Floors{}); err != nil || !e.Held {
		t.Fatalf("a forced drain: %+v %v", e, err)
	}
}

func TestRoleAndPin(t *testing.T) {
	f := newFleet(t)
	t1 := t0.Add(time.Minute)
	e, err := f.SetRole("e2", Prefill, t1, "decision 1")
	if err != nil || e.Role != Prefill || !e.RoleSince.Equal(t1) {
		t.Fatalf("role move: %+v %v", e, err)
	}
	if _, err := f.SetRole("e2", Prefill, t1, "x"); !errors.Is(err, ErrTransition) {
		t.Fatalf("same role: %v", err)
	}
	if _, err := f.SetRole("e3", Prefill, t1, "x"); !errors.Is(err, ErrTransition) {
		t.Fatalf("moved a pinned engine: %v", err)
	}
	if _, err := f.SetRole("e1", Role(9), t1, "x"); !errors.Is(err, ErrTransition) {
		t.Fatalf("invalid role: %v", err)
	}
	v := f.Version()
	if _, err := f.SetPinned("e3", true, t1, "admin"); err != nil || f.Version() != v {
		t.Fatalf("pinning a pinned engine must change nothing: %v, version %d -> %d", err, v, f.Version())
	}
	if e, err := f.SetPinned("e3", false, t1, "admin"); err != nil || e.Pinned || f.Version() != v+1 {
		t.Fatalf("unpin: %+v %v", e, err)
	}
	if e, err := f.SetRole("e3", Prefill, t1, "x"); err != nil || e.Role != Prefill {
		t.Fatalf("an unpinned engine moves: %+v %v", e, err)
	}
}

func TestSetAddr(t *testing.T) {
	f := newFleet(t)
	ap := netip.MustParseAddrPort("10.1.2.3:8003")
	if e, err := f.SetAddr("e3", ap, t0); err != nil || e.Addr != "10.1.2.3:8003" || e.Address != "engine-3:8003" {
		t.Fatalf("%+v %v", e, err)
	}
	v := f.Version()
	if _, err := f.SetAddr("e3", ap, t0); err != nil || f.Version() != v {
		t.Fatal("the same address bumped the version")
	}
	if _, err := f.SetAddr("e3", netip.AddrPort{}, t0); err == nil {
		t.Fatal("an invalid address was accepted")
	}
}

func TestSubscribeCoalesces(t *testing.T) {
	f := newFleet(t)
	ch, cancel := f.Subscribe()
	for i := 0; i < 5; i++ {
		pinned := i%2 == 0
		if _, err := f.SetPinned("e1", pinned, t0, "t"); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-ch:
	default:
		t.Fatal("no wake after changes")
	}
	select {
	case <-ch:
		t.Fatal("five changes woke a slow reader more than once")
	default:
	}
	cancel()
	_, _ = f.SetPinned("e1", false, t0, "t")
	select {
	case <-ch:
		t.Fatal("a cancelled subscription was woken")
	default:
	}
}

// TestConcurrent runs writers and readers together (under -race): the version seen by readers
// never goes back and counts every change.
func TestConcurrent(t *testing.T) {
	f := newFleet(t)
	var mu sync.Mutex
	events := 0
	f.OnChange(func(Event) { mu.Lock(); events++; mu.Unlock() })
	ch, cancel := f.Subscribe()
	defer cancel()
	const writers, changes = 4, 200
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Go(func() {
			for i := 0; i < changes; i++ {
				if _, err := f.SetPinned("e1", true, t0, "t"); err != nil {
					t.Error(err)
				}
				if _, err := f.SetPinned("e1", false, t0, "t"); err != nil {
					t.Error(err)
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	var last uint64
	for reading := true; reading; {
		select {
		case <-done:
			reading = false
		case <-ch:
		}
		s := f.Snapshot()
		if s.Version < last {
			t.Fatalf("version went back: %d after %d", s.Version, last)
		}
		last = s.Version
	}
	// A pin or unpin changes the fleet unless another writer already did: the version counts
	// exactly the changes made (one event each), and there were some.
	mu.Lock()
	defer mu.Unlock()
	if v := f.Version(); v != 1+uint64(events) || events == 0 {
		t.Fatalf("version %d after %d changes", v, events)
	}
}

// An in-place switch (switch: sglang): StartSwitch holds the engine out of placement in its old
// role; a success gives it the new role (the role event names the decision) and makes it active;
// a failure fails it; one abandoned records only its end. Engines that switch by routing, pinned
// ones, ones not active, and a second switch are refused; SetLifecycle cannot enter or end one.
func TestInPlaceSwitch(t *testing.T) {
	cfg := testConfig()
	for i := range cfg.Engines {
		cfg.Engines[i].Switch = config.SwitchSGLang
	}
	cfg.Engines = append(cfg.Engines, config.Engine{ID: "e4", Address: "127.0.0.1:8004", Role: "decode", Profile: config.DefaultProfileName})
	f, err := New(cfg, t0)
	if err != nil {
		t.Fatal(err)
	}
	var evs []Event
	f.OnChange(func(ev Event) { evs = append(evs, ev) })
	t1 := t0.Add(time.Minute)
	for _, c := range []struct {
		id  string
		to  Role
		err string
	}{
		{"e4", Prefill, "changes role by routing"},
		{"e3", Prefill, "pinned"},
		{"e2", Decode, "already decode"},
	} {
		if _, err := f.StartSwitch(c.id, c.to, t1, Mover{Decision: 1}); !errors.Is(err, ErrTransition) || !strings.Contains(err.Error(), c.err) {
			t.Errorf("StartSwitch(%s): %v, want %q", c.id, err, c.err)
		}
	}
	e, err := f.StartSwitch("e2", Prefill, t1, Mover{Decision: 7})
	if err != nil || e.Lifecycle != Switching || e.Role != Decode || e.SwitchTo != Prefill || e.Live() {
		t.Fatalf("StartSwitch: %+v %v", e, err)
	}
	if _, err := f.StartSwitch("e2", Prefill, t1, Mover{Decision: 8}); err == nil {
		t.Error("a second switch was started")
	}
	for _, to := range []Lifecycle{Active, Switching} {
		if _, err := f.SetLifecycle("e2", to, t1, "health"); !errors.Is(err, ErrTransition) {
			t.Errorf("SetLifecycle(switching -> %s): %v", to, err)
		}
	}
	t2 := t1.Add(time.Second)
	e, err = f.FinishSwitch("e2", SwitchSucceeded, t2, "engine: switched")
	if err != nil || e.Lifecycle != Active || e.Role != Prefill || e.SwitchTo != 0 || !e.RoleSince.Equal(t2) || !e.Moved {
		t.Fatalf("FinishSwitch succeeded: %+v %v", e, err)
	}
	if _, err := f.FinishSwitch("e2", SwitchSucceeded, t2, ""); err == nil {
		t.Error("a switch ended twice")
	}
	// A failure: the engine is failed in its old role.
	if _, err := f.StartSwitch("e1", Decode, t2, Mover{Decision: 9}); err != nil {
		t.Fatal(err)
	}
	if e, err = f.FinishSwitch("e1", SwitchFailed, t2, "engine: rebuild failed"); err != nil || e.Lifecycle != Failed || e.Role != Prefill {
		t.Fatalf("FinishSwitch failed: %+v %v", e, err)
	}
	want := []string{
		"lifecycle e2 active->switching decision 7",
		"switch e2 decode->prefill engine: switched succeeded",
		"role e2 decode->prefill decision 7",
		"lifecycle e2 switching->active switch",
		"lifecycle e1 active->switching decision 9",
		"switch e1 prefill->decode engine: rebuild failed failed",
		"lifecycle e1 switching->failed switch failed: engine: rebuild failed",
	}
	var got []string
	for _, ev := range evs {
		s := fmt.Sprintf("%s %s %s->%s %s", ev.Kind, ev.Engine, ev.From, ev.To, ev.Cause)
		if ev.Result != "" {
			s += " " + string(ev.Result)
		}
		got = append(got, s)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Drained while switching: the lifecycle follows the operator; an abandoned end keeps it.
	cfg2 := testConfig()
	cfg2.Engines[1].Switch = config.SwitchSGLang
	f2, _ := New(cfg2, t0)
	if _, err := f2.StartSwitch("e2", Prefill, t1, Mover{Decision: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := f2.Drain("e2", t1, "admin", Floors{}); err != nil {
		t.Fatal(err)
	}
	if e, err := f2.FinishSwitch("e2", SwitchAbandoned, t2, "left switching before the call"); err != nil || e.Lifecycle != Draining || e.Role != Decode || e.SwitchTo != 0 {
		t.Fatalf("abandoned: %+v %v", e, err)
	}
}

// Engines join recovering, in their source's role or provisionally decode with the role open,
// and leave whatever their lifecycle; every change is one version and one event, and the
// snapshot keeps the fleet's order with the newcomers last.
func TestAddRemove(t *testing.T) {
	f := newFleet(t)
	var evs []Event
	f.OnChange(func(ev Event) { evs = append(evs, ev) })
	at := t0.Add(time.Minute)
	e, err := f.Add(config.Engine{ID: "e4", Address: "10.0.0.4:8000", Role: "prefill", Profile: config.DefaultProfileName}, "file", at)
	if err != nil {
		t.Fatal(err)
	}
	if e.Role != Prefill || e.RoleOpen || e.Lifecycle != Recovering || e.Live() || e.Source != "file" || !e.LifecycleSince.Equal(at) || e.Moved {
		t.Fatalf("added e4 = %+v", e)
	}
	open, err := f.Add(config.Engine{ID: "e5", Address: "10.0.0.5:8000", Profile: config.DefaultProfileName, Switch: config.SwitchSGLang}, "admin", at)
	if err != nil {
		t.Fatal(err)
	}
	if open.Role != Decode || !open.RoleOpen || !open.InPlace {
		t.Fatalf("added e5 = %+v", open)
	}
	for _, bad := range []config.Engine{
		{ID: "e1", Address: "10.0.0.9:8000", Role: "decode"},    // a name the fleet has
		{ID: "e9", Address: "127.0.0.1:8002", Role: "decode"},   // e2's address
		{ID: "e9", Address: "10.0.0.9:8000", Role: "aggregate"}, // no such role
	} {
		if _, err := f.Add(bad, "file", at); err == nil {
			t.Errorf("Add(%+v) succeeded", bad)
		}
	}
	if _, err := f.Remove("e2", at, "file"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Remove("e2", at, "file"); !errors.Is(err, ErrUnknownEngine) {
		t.Fatalf("second Remove: %v", err)
	}
	s := f.Snapshot()
	var ids []string
	for _, e := range s.Engines {
		ids = append(ids, e.ID)
	}
	if !slices.Equal(ids, []string{"e1", "e3", "e4", "e5"}) || s.Version != 4 {
		t.Fatalf("engines %v at version %d", ids, s.Version)
	}
	if p, d := s.Split(); p != 1 || d != 1 {
		t.Fatalf("split %d/%d: the newcomers are not live yet", p, d)
	}
	// Index follows the removal: e4 and e5 are still found and changed by id.
	if _, err := f.SetLifecycle("e4", Active, at, "health"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.SetRole("e5", Prefill, at, "decision 1"); err != nil {
		t.Fatal(err)
	}
	if e, _ := f.Engine("e5"); e.RoleOpen || e.Role != Prefill {
		t.Fatalf("e5 after its role was set: %+v", e)
	}
	want := []string{"added e4 prefill file", "added e5 decode admin", "removed e2 decode file"}
	for i, w := range want {
		ev := evs[i]
		if got := fmt.Sprintf("%s %s %s%s %s", ev.Kind, ev.Engine, ev.From, ev.To, ev.Cause); got != w {
			t.Errorf("event %d = %q, want %q", i, got, w)
		}
	}
	if evs[0].Address != "10.0.0.4:8000" || evs[0].Profile != config.DefaultProfileName {
		t.Errorf("added event %+v", evs[0])
	}
	// An id removed can join again.
	if _, err := f.Add(config.Engine{ID: "e2", Address: "10.0.0.2:8000", Role: "decode", Profile: config.DefaultProfileName}, "file", at); err != nil {
		t.Fatal(err)
	}
}

// A restart restores engines added at run time whole, and drops config engines the config no
// longer has.
func TestRestoreAdded(t *testing.T) {
	f := newFleet(t)
	at := t0.Add(time.Hour)
	// A standby's fleet has an engine its leader has removed since: it goes.
	if _, err := f.Add(config.Engine{ID: "gone", Address: "10.1.0.9:8000", Role: "decode", Profile: config.DefaultProfileName}, "file", t0); err != nil {
		t.Fatal(err)
	}
	saved := []Engine{
		{ID: "e1", Role: Decode, RoleSince: at, Moved: true, Lifecycle: Active, LifecycleSince: t0, Source: SourceConfig},
		{ID: "old", Role: Decode, Lifecycle: Active, Source: SourceConfig},
		{ID: "k1", Address: "10.1.0.1:8000", Profile: config.DefaultProfileName, Role: Prefill, Lifecycle: Active, RoleSince: at, LifecycleSince: at, Source: "kubernetes", SwitchAsked: true},
	}
	unknown, err := f.Restore(saved)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(unknown, []string{"old"}) {
		t.Fatalf("unknown %v", unknown)
	}
	k1, ok := f.Engine("k1")
	if !ok || k1.Addr != "10.1.0.1:8000" || k1.Role != Prefill || k1.Source != "kubernetes" || k1.SwitchAsked || !k1.Live() {
		t.Fatalf("k1 = %+v", k1)
	}
	if _, ok := f.Engine("gone"); ok || len(f.Snapshot().Engines) != 4 {
		t.Fatalf("after restore: %+v", f.Snapshot().Engines)
	}
	if _, err := f.Remove("k1", at, "kubernetes"); err != nil {
		t.Fatal(err)
	}
}

// mixedFleet is testConfig's fleet with e2 switching in place and a fourth engine, e4 (decode),
// that changes role by routing.
func mixedFleet(t *testing.T) *Fleet {
	t.Helper()
	cfg := testConfig()
	cfg.Engines[1].Switch = config.SwitchSGLang
	cfg.Engines = append(cfg.Engines, config.Engine{ID: "e4", Address: "127.0.0.1:8004", Role: "decode", Profile: config.DefaultProfileName})
	f, err := New(cfg, t0)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Snapshot.Move previews Fleet.Move by the same transition: an engine that changes role by
// routing takes the role, one that switches in place is held switching with its target; a move
// the fleet refuses (a pinned engine, an unknown one) is an error and leaves the snapshot as it
// was.
func TestSnapshotMovePreviewsTheFleet(t *testing.T) {
	f := mixedFleet(t)
	t1 := t0.Add(time.Minute)
	preview := f.Snapshot()
	for _, m := range []struct {
		id string
		to Role
	}{{"e2", Prefill}, {"e4", Prefill}} {
		if err := preview.Move(m.id, m.to, t1, 1); err != nil {
			t.Fatalf("preview %s: %v", m.id, err)
		}
		if _, err := f.Move(m.id, m.to, t1, 1); err != nil {
			t.Fatalf("move %s: %v", m.id, err)
		}
	}
	after := f.Snapshot()
	if !reflect.DeepEqual(preview.Engines, after.Engines) {
		t.Fatalf("the preview differs from the fleet:\n%+v\n%+v", preview.Engines, after.Engines)
	}
	if e, _ := after.Find("e2"); e.Lifecycle != Switching || e.SwitchTo != Prefill || e.Role != Decode {
		t.Fatalf("e2 (in place): %+v", e)
	}
	if e, _ := after.Find("e4"); e.Role != Prefill || !e.Moved {
		t.Fatalf("e4 (routing): %+v", e)
	}
	before := f.Snapshot()
	for _, id := range []string{"e3", "e9"} { // pinned, unknown
		if err := before.Move(id, Prefill, t1, 2); err == nil {
			t.Errorf("%s: the preview moved it", id)
		}
	}
	if !reflect.DeepEqual(before.Engines, f.Snapshot().Engines) {
		t.Fatal("a refused preview changed the snapshot")
	}
}

// A decision's move carries the decision's number on its events: the role event of an engine
// that changes role by routing, and for one that switches in place the start of the switch and
// the role event that ends it, however later. An operator's change carries none.
func TestMoveEventsCarryTheDecision(t *testing.T) {
	f := mixedFleet(t)
	var got []string
	f.OnChange(func(ev Event) {
		s := fmt.Sprintf("%s %s %s->%s %q #%d", ev.Engine, ev.Kind, ev.From, ev.To, ev.Cause, ev.Decision)
		if ev.Operator {
			s += " operator"
		}
		got = append(got, s)
	})
	t1 := t0.Add(time.Minute)
	if _, err := f.Move("e4", Prefill, t1, 7); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Move("e2", Prefill, t1, 8); err != nil {
		t.Fatal(err)
	}
	if _, err := f.AskSwitch("e2", t1, "asked"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.FinishSwitch("e2", SwitchSucceeded, t1.Add(time.Second), "ok"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Relabel("e4", Decode, t1, "kubernetes"); err != nil {
		t.Fatal(err)
	}
	// An operator's relabel of an engine that switches in place: the switch's end says so too.
	if _, err := f.Relabel("e2", Decode, t1.Add(time.Minute), "file"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.FinishSwitch("e2", SwitchSucceeded, t1.Add(time.Minute), "ok"); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`e4 role decode->prefill "decision 7" #7`,
		`e2 lifecycle active->switching "decision 8" #8`,
		`e2 switch decode->prefill "asked" #0`,
		`e2 switch decode->prefill "ok" #0`,
		`e2 role decode->prefill "decision 8" #8`,
		`e2 lifecycle switching->active "switch" #0`,
		`e4 role prefill->decode "operator (kubernetes)" #0 operator`,
		`e2 lifecycle active->switching "operator (file)" #0`,
		`e2 switch prefill->decode "ok" #0`,
		`e2 role prefill->decode "operator (file)" #0 operator`,
		`e2 lifecycle switching->active "switch" #0`,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// An engine that can play one role (engines[].roles) keeps it as a pinned one does, for good:
// it cannot be moved, nor unpinned, and a state saved before its roles were limited does not
// give it the other role; added at run time without a role, it takes the one it can play.
func TestOneRole(t *testing.T) {
	c := testConfig()
	c.Engines[0].Roles = []string{config.RolePrefill}
	f, err := New(c, t0)
	if err != nil {
		t.Fatal(err)
	}
	t1 := t0.Add(time.Minute)
	if e, _ := f.Engine("e1"); !e.Pinned || !e.Fixed || e.Role != Prefill {
		t.Fatalf("e1: %+v", e)
	}
	if _, err := f.SetRole("e1", Decode, t1, "x"); !errors.Is(err, ErrTransition) {
		t.Fatalf("moved an engine that can play prefill only: %v", err)
	}
	if _, err := f.SetPinned("e1", false, t1, "admin"); !errors.Is(err, ErrTransition) || !strings.Contains(err.Error(), "engines[].roles") {
		t.Fatalf("unpinned an engine that can play prefill only: %v", err)
	}
	saved := f.Snapshot().Engines
	saved[0].Role = Decode // a state from before its roles were limited
	if _, err := f.Restore(saved); err != nil {
		t.Fatal(err)
	}
	if e, _ := f.Engine("e1"); e.Role != Prefill || !e.Pinned {
		t.Fatalf("restored: %+v", e)
	}
	e, err := f.Add(config.Engine{ID: "s1", Address: "10.0.0.9:8000", Profile: config.DefaultProfileName, Roles: []string{config.RoleDecode}}, "admin", t1)
	if err != nil || e.Role != Decode || e.RoleOpen || !e.Fixed {
		t.Fatalf("added: %+v %v", e, err)
	}
}

// Events reach the observers after the fleet's lock is released (House III: a slow observer —
// serve's writes the decision log's line — held the write lock, and every reader and change with
// it). An observer that blocks holds up the delivery and the caller of the change it is
// delivering, not the fleet: readers read, subscribers wake, other changes are made (their
// events wait their turn, in order); an observer stopped sees no more.
func TestObserversRunOutsideTheLock(t *testing.T) {
	f := mixedFleet(t)
	entered, release := make(chan Event, 4), make(chan struct{})
	var seen []string
	var mu sync.Mutex
	stop := f.OnChange(func(ev Event) {
		entered <- ev
		<-release
		mu.Lock()
		seen = append(seen, ev.Engine+" "+ev.To)
		mu.Unlock()
	})
	wake, cancel := f.Subscribe()
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := f.SetLifecycle("e1", Failed, t0.Add(time.Second), "test"); done <- err }()
	<-entered // the observer is blocked in the first delivery
	if e, _ := f.Engine("e1"); e.Lifecycle != Failed {
		t.Fatalf("a reader sees e1 %v while the observer blocks", e.Lifecycle)
	}
	<-wake // subscribers were woken by the change itself
	second := make(chan error, 1)
	go func() { _, err := f.Drain("e2", t0.Add(time.Second), "test", Floors{}); second <- err }()
	poll.Until(t, 5*time.Second, "the second change made while the first is being delivered", func() bool {
		e, _ := f.Engine("e2")
		return e.Lifecycle == Draining
	})
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := slices.Clone(seen)
	mu.Unlock()
	if want := []string{"e1 failed", "e2 draining", "e2 "}; !slices.Equal(got, want) { // the drain: lifecycle, then hold
		t.Fatalf("delivered %v, want %v in order", got, want)
	}
	stop()
	if _, err := f.Undrain("e2", t0.Add(2*time.Second), "test"); err != nil {
		t.Fatal(err)
	}
	if len(entered) != 2 { // e2's two, not read above; none after the stop
		t.Fatalf("an observer stopped was called again (%d deliveries unread, want 2)", len(entered))
	}
}

// A restore (a standby taking its leader's state) reaches the fleet's followers as any change
// does: subscribers wake and observers see one EventRestored, with a new version.
func TestRestoreIsAChange(t *testing.T) {
	f := mixedFleet(t)
	wake, cancel := f.Subscribe()
	defer cancel()
	var got []Event
	stop := f.OnChange(func(ev Event) { got = append(got, ev) })
	defer stop()
	snap := f.Snapshot()
	if err := snap.Move("e1", Decode, t0.Add(time.Second), 1); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Restore(snap.Engines); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
	default:
		t.Fatal("a restore did not wake the subscribers")
	}
	if len(got) != 1 || got[0].Kind != EventRestored || got[0].Version != snap.Version+1 {
		t.Fatalf("observers saw %+v, want one restored event at version %d", got, snap.Version+1)
	}
	if e, _ := f.Engine("e1"); e.Role != Decode {
		t.Fatalf("e1 restored as %v", e.Role)
	}
}
