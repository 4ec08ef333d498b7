package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/controller"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func testConfig(t *testing.T, ids ...string) *config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.Engines = nil
	for i, id := range ids {
		role := "prefill"
		if i%2 == 1 {
			role = "decode"
		}
		cfg.Engines = append(cfg.Engines, config.Engine{ID: id, Address: "10.0.0." + string(rune('1'+i)) + ":80", Role: role, Profile: config.DefaultProfileName})
	}
	return cfg
}

// A state captured, saved, loaded and restored gives back every durable field: roles and
// their times (a move before the restart stays a move), lifecycles, holds, pins, corrections,
// and the controller's sequence, cooldown, confirmations and window.
func TestRoundTrip(t *testing.T) {
	cfg := testConfig(t, "a", "b", "c", "d")
	f, err := fleet.New(cfg, t0)
	if err != nil {
		t.Fatal(err)
	}
	moved := t0.Add(10 * time.Second)
	if _, err := f.SetRole("b", fleet.Prefill, moved, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Drain("d", moved, "test", fleet.Floors{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.SetPinned("c", true, moved, "test"); err != nil {
		t.Fatal(err)
	}
	// Engines that joined at run time: their membership is durable too.
	if _, err := f.Add(config.Engine{ID: "k1", Address: "10.1.0.1:80", Profile: config.DefaultProfileName, Switch: config.SwitchSGLang}, "kubernetes", moved); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Add(config.Engine{ID: "k2", Address: "10.1.0.2:80", Role: "prefill", Profile: config.DefaultProfileName}, "file", moved); err != nil {
		t.Fatal(err)
	}
	last := t0.Add(5 * time.Second)
	d := controller.Durable{Seq: 41, LastToDecode: &last, Confirmations: decisionlog.Confirmed{DecodeExpand: 2}}
	d.Window.OpenedAt, d.Window.Arrivals, d.Window.Closed = t0, 77, true
	loads := []router.EngineLoad{{ID: "a", Correction: router.Correction{Prefill: 1.4, Decode: 0.9, PrefillSamples: 30, DecodeSamples: 12}}}
	dir := filepath.Join(t.TempDir(), "st")
	if err := Save(dir, Capture(f.Snapshot(), d, loads, t0.Add(20*time.Second))); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != FileName {
		t.Fatalf("the state dir holds %v, want only %s", entries, FileName)
	}
	got, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	f2, err := fleet.New(cfg, t0.Add(30*time.Second)) // the next run
	if err != nil {
		t.Fatal(err)
	}
	engines, err := got.Fleet()
	if err != nil {
		t.Fatal(err)
	}
	if unknown, err := f2.Restore(engines); err != nil || len(unknown) != 0 {
		t.Fatalf("restore: %v %v", unknown, err)
	}
	b, _ := f2.Engine("b")
	if b.Role != fleet.Prefill || !b.Moved || !b.RoleSince.Equal(moved) {
		t.Fatalf("b after restore: %+v", b)
	}
	if e, _ := f2.Engine("d"); e.Lifecycle != fleet.Draining || !e.Held {
		t.Fatalf("d after restore: %+v", e)
	}
	if e, _ := f2.Engine("c"); !e.Pinned {
		t.Fatalf("c after restore: %+v", e)
	}
	if a, _ := f2.Engine("a"); a.Moved || a.Role != fleet.Prefill || a.Source != fleet.SourceConfig {
		t.Fatalf("a after restore: %+v", a)
	}
	k1, _ := f2.Engine("k1")
	k2, _ := f2.Engine("k2")
	if k1.Source != "kubernetes" || k1.Addr != "10.1.0.1:80" || !k1.InPlace || !k1.RoleOpen || k1.Lifecycle != fleet.Recovering ||
		k2.Source != "file" || k2.Role != fleet.Prefill || k2.RoleOpen || k2.Profile != config.DefaultProfileName {
		t.Fatalf("added engines after restore: %+v %+v", k1, k2)
	}
	if added, removed, err := got.Match(cfg); err != nil || len(added)+len(removed) != 0 {
		t.Fatalf("Match counts the added engines as config engines: %v %v %v", added, removed, err)
	}
	if c := got.Corrections()["a"]; c.Prefill != 1.4 || c.DecodeSamples != 12 {
		t.Fatalf("corrections %+v", c)
	}
	gc := got.Controller
	if gc.Seq != 41 || gc.LastToDecode == nil || !gc.LastToDecode.Equal(last) || gc.Confirmations.DecodeExpand != 2 ||
		gc.Window.Arrivals != 77 || !gc.Window.Closed || !gc.Window.OpenedAt.Equal(t0) {
		t.Fatalf("controller state %+v", gc)
	}
}

// Bad files are errors naming the file and what is wrong; a missing one is ErrNoState.
func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir); !errors.Is(err, ErrNoState) {
		t.Fatalf("empty dir: %v", err)
	}
	path := filepath.Join(dir, FileName)
	for name, content := range map[string]string{
		"not json":      "{\"version\": 1, \"engines\": [",
		"unknown field": `{"version": 1, "engines": [], "controller": {}, "color": "red"}`,
		"bad role":      `{"version": 1, "engines": [{"id": "a", "role": "chef", "lifecycle": "active"}], "controller": {}}`,
		"old version":   `{"version": 0, "engines": [], "controller": {}}`,
		"newer version": `{"version": 3, "engines": [], "controller": {}}`,
	} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Load(dir)
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v, want an error naming %s", name, err, path)
		}
	}
}

// Engines added to or removed from the config are listed; a file with none of the config's
// engines belongs to another fleet.
func TestMatch(t *testing.T) {
	f := &File{Engines: []Engine{{ID: "a"}, {ID: "b"}, {ID: "x"}}}
	added, removed, err := f.Match(testConfig(t, "a", "b", "c"))
	if err != nil || strings.Join(added, ",") != "c" || strings.Join(removed, ",") != "x" {
		t.Fatalf("added %v removed %v err %v", added, removed, err)
	}
	if _, _, err := f.Match(testConfig(t, "p", "q")); err == nil || !strings.Contains(err.Error(), "another fleet") {
		t.Fatalf("foreign file: %v", err)
	}
}

// The file is JSON with the version first: an operator can read it.
func TestWrittenForm(t *testing.T) {
	dir := t.TempDir()
	f, _ := fleet.New(testConfig(t, "a", "b"), t0)
	if err := Save(dir, Capture(f.Snapshot(), controller.Durable{}, nil, t0)); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(filepath.Join(dir, FileName))
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil || m["version"] != float64(Version) || !strings.HasPrefix(string(data), fmt.Sprintf("{\n  \"version\": %d", Version)) {
		t.Fatalf("%s (%v)", data, err)
	}
}

// BenchmarkSave is one durable write of a 64-engine state (fsyncs included): the cost of a
// role change or a decision to the writer goroutine, never to placement.
func BenchmarkSave(b *testing.B) {
	ids := make([]string, 64)
	for i := range ids {
		ids[i] = "e" + string(rune('a'+i/26)) + string(rune('a'+i%26))
	}
	cfg := config.Default()
	for i, id := range ids {
		role := "prefill"
		if i%2 == 1 {
			role = "decode"
		}
		cfg.Engines = append(cfg.Engines, config.Engine{ID: id, Address: "10.0.0.1:80", Role: role, Profile: config.DefaultProfileName})
	}
	f, err := fleet.New(cfg, t0)
	if err != nil {
		b.Fatal(err)
	}
	file := Capture(f.Snapshot(), controller.Durable{}, nil, t0)
	dir := b.TempDir()
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	for b.Loop() {
		begin := time.Now()
		if err := Save(dir, file); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(begin))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// One process per state directory: a second holder is refused with the directory and the
// holder's pid; a released lock, or one left by a process that is gone, is taken.
func TestLock(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "st")
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Acquire(dir) // another open file: flock refuses it as it would another process
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("second holder: %v", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	// A lock file whose writer is gone (no flock held on it) is no obstacle.
	if err := os.WriteFile(filepath.Join(dir, LockName), []byte("999999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l2, err := Acquire(dir)
	if err != nil {
		t.Fatalf("a stale lock file: %v", err)
	}
	defer l2.Release()
	if data, _ := os.ReadFile(filepath.Join(dir, LockName)); strings.TrimSpace(string(data)) != strconv.Itoa(os.Getpid()) {
		t.Fatalf("lock file says %q", data)
	}
}

// The state directory is created 0700, and a lock file that is a symbolic link is refused
// without touching what it points to (writing the pid truncates the lock file).
func TestLockRefusesASymlink(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "st")
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Release()
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("state dir mode %v %v, want 0700", fi.Mode().Perm(), err)
	}
	if fi, err := os.Stat(filepath.Join(dir, LockName)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("lock file mode %v %v, want 0600", fi.Mode().Perm(), err)
	}
	target := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(target, []byte("keep me\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, LockName)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, LockName)); err != nil {
		t.Fatal(err)
	}
	if _, err := Acquire(dir); err == nil || !strings.Contains(err.Error(), "is a symbolic link") {
		t.Fatalf("a symlinked lock file: %v", err)
	}
	if data, _ := os.ReadFile(target); string(data) != "keep me\n" {
		t.Fatalf("the link's target now holds %q", data)
	}
}

// An in-place switch under way is durable with the decision that started it: after a restart
// the switch ends with the role event naming that decision, as it would have without one.
func TestSwitchUnderWayKeepsItsDecision(t *testing.T) {
	cfg := testConfig(t, "a", "b")
	cfg.Engines[0].Switch = config.SwitchSGLang
	f, err := fleet.New(cfg, t0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Move("a", fleet.Decode, t0.Add(time.Minute), 9); err != nil {
		t.Fatal(err)
	}
	data, err := Encode(Capture(f.Snapshot(), controller.Durable{Seq: 9}, nil, t0.Add(time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	file, err := Decode(data, "test")
	if err != nil {
		t.Fatal(err)
	}
	f2, err := fleet.New(cfg, t0.Add(2*time.Minute)) // the next run
	if err != nil {
		t.Fatal(err)
	}
	if err := file.Apply(cfg, f2, "test", slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	var role []fleet.Event
	f2.OnChange(func(ev fleet.Event) {
		if ev.Kind == fleet.EventRole {
			role = append(role, ev)
		}
	})
	if _, err := f2.AskSwitch("a", t0.Add(2*time.Minute), "idle"); err != nil {
		t.Fatal(err)
	}
	if _, err := f2.FinishSwitch("a", fleet.SwitchSucceeded, t0.Add(2*time.Minute), "ok"); err != nil {
		t.Fatal(err)
	}
	if len(role) != 1 || role[0].Decision != 9 || role[0].Cause != "decision 9" || role[0].To != "decode" {
		t.Fatalf("role events after the restart: %+v", role)
	}
}

// A version-1 state (before switch_decision) is read and upgraded: the decision of a switch
// under way comes from its cause's text, and the state is version 2.
func TestUpgradeFromVersion1(t *testing.T) {
	v1 := `{"version": 1, "written": "2026-12-01T00:00:00Z", "engines": [` +
		`{"id": "a", "role": "prefill", "role_since": "2026-12-01T00:00:00Z", "moved": false, "lifecycle": "switching", "lifecycle_since": "2026-12-01T00:00:00Z", "pinned": false, "held": false, "switch_to": "decode", "switch_cause": "decision 7", "correction": {"prefill": 1, "decode": 1, "prefill_samples": 0, "decode_samples": 0}, "in_place": true},` +
		`{"id": "b", "role": "decode", "role_since": "2026-12-01T00:00:00Z", "moved": false, "lifecycle": "active", "lifecycle_since": "2026-12-01T00:00:00Z", "pinned": false, "held": false, "correction": {"prefill": 1, "decode": 1, "prefill_samples": 0, "decode_samples": 0}}], ` +
		`"controller": {"seq": 7, "confirmations": {"prefill_expand": 0, "prefill_consolidate": 0, "decode_expand": 0, "decode_consolidate": 0}, "evidence_window": {"opened_at": "2026-12-01T00:00:00Z", "arrivals": 0, "closed": false}}}`
	f, err := Decode([]byte(v1), "v1")
	if err != nil {
		t.Fatal(err)
	}
	if f.Version != Version || f.Engines[0].SwitchDecision != 7 || f.Engines[1].SwitchDecision != 0 {
		t.Fatalf("upgraded: version %d, switch decisions %d and %d", f.Version, f.Engines[0].SwitchDecision, f.Engines[1].SwitchDecision)
	}
}

// An operator's in-place switch under way survives a restart: the role event ending it says an
// operator made it (so that discovery does not write the role back to its source), from the
// state's switch_cause, the form every schema-2 build writes and reads.
func TestOperatorSwitchAcrossARestart(t *testing.T) {
	cfg := &config.Config{Engines: []config.Engine{
		{ID: "a", Address: "10.0.0.1:8000", Role: "prefill", Switch: config.SwitchSGLang},
		{ID: "b", Address: "10.0.0.2:8000", Role: "decode"},
	}}
	f, err := fleet.New(cfg, t0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Relabel("a", fleet.Decode, t0.Add(time.Minute), "kubernetes"); err != nil {
		t.Fatal(err)
	}
	data, err := Encode(Capture(f.Snapshot(), controller.Durable{}, nil, t0.Add(time.Minute)))
	if err != nil || !strings.Contains(string(data), `"switch_cause": "operator (kubernetes)"`) {
		t.Fatalf("written: %v\n%s", err, data)
	}
	file, err := Decode(data, "state")
	if err != nil {
		t.Fatal(err)
	}
	engines, err := file.Fleet()
	if err != nil {
		t.Fatal(err)
	}
	if by := engines[0].SwitchBy; by != (fleet.Mover{Operator: "kubernetes"}) {
		t.Fatalf("switch started by %+v, want the operator at kubernetes", by)
	}
}
