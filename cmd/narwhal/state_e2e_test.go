package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func engineOf(st stateView, id string) engineView {
	for _, e := range st.Engines {
		if e.ID == id {
			return e
		}
	}
	return engineView{}
}

// Issue 11, durable state of a single instance: an operator's pin and drain survive a restart
// of narwhal serve (the log says the state was restored); --reset-state starts from the config;
// a corrupt state file and another fleet's state file each stop serve with one line naming the
// file.
func TestServeKeepsItsStateAcrossRestarts(t *testing.T) {
	_, engines := startEngines(t, "prefill", "prefill", "decode", "decode")
	stateDir := filepath.Join(t.TempDir(), "state")
	cfg := writeConfig(t, e2eConfig(anyPort, anyPort, anyPort, engines)+fmt.Sprintf("state: {dir: %q}\n", stateDir))

	srv := start(t, "serve", "--config", cfg)
	admin, _, _ := srv.serving(t)
	waitFor(t, admin, 10*time.Second, "four active engines", allActive(4))
	for _, call := range []string{"e1/pin", "e4/drain"} {
		if code, err := httpPost("http://" + admin + "/narwhal/engines/" + call); err != nil || code != 200 {
			t.Fatalf("%s: %d %v", call, code, err)
		}
	}
	kept := func(s stateView) bool {
		return engineOf(s, "e1").Pinned && engineOf(s, "e4").Lifecycle == "draining" && engineOf(s, "e4").Drained
	}
	waitFor(t, admin, 5*time.Second, "e1 pinned, e4 drained", kept)
	if code, _ := srv.stop(t); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	// A role the controller had moved (written here: e2 to decode) comes back too, and the
	// start line says the split serve starts with, not the config's.
	file := filepath.Join(stateDir, "narwhal-state.json")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	for _, e := range doc["engines"].([]any) {
		if e := e.(map[string]any); e["id"] == "e2" {
			e["role"] = "decode"
		}
	}
	if b, err = json.Marshal(doc); err != nil || os.WriteFile(file, b, 0o600) != nil {
		t.Fatal(err)
	}

	srv = start(t, "serve", "--config", cfg)
	admin, _, _ = srv.serving(t)
	st := waitFor(t, admin, 5*time.Second, "the pin and the drain restored", kept)
	if st.Split.Prefill != 1 || st.Split.Decode != 2 || engineOf(st, "e2").Role != "decode" {
		t.Fatalf("split %+v after the restart, want 1 prefill and 2 decode (e2 decode, e4 drained)", st.Split)
	}
	if !strings.Contains(srv.out.String(), "durable state restored") {
		t.Fatalf("the log does not say the state was restored:\n%s", srv.out.String())
	}
	if line := logged(t, srv.out, "narwhal serving", "prefill", "decode"); line[0] != "1" || line[1] != "3" {
		t.Fatalf("the start line says prefill=%s decode=%s, want the restored 1 and 3", line[0], line[1])
	}
	if code, _ := srv.stop(t); code != 0 {
		t.Fatalf("serve exited %d", code)
	}

	srv = start(t, "serve", "--config", cfg, "--reset-state")
	admin, _, _ = srv.serving(t)
	st = waitFor(t, admin, 10*time.Second, "the config's state again", allActive(4))
	if engineOf(st, "e1").Pinned {
		t.Fatalf("e1 still pinned after --reset-state: %+v", st)
	}
	if code, _ := srv.stop(t); code != 0 {
		t.Fatalf("serve exited %d", code)
	}

	for name, content := range map[string]string{
		"corrupt":       "{\"version\": 1, \"engines\": [",
		"another fleet": `{"version": 1, "written": "2026-12-01T00:00:00Z", "engines": [{"id": "x9", "role": "decode", "role_since": "2026-12-01T00:00:00Z", "moved": false, "lifecycle": "active", "lifecycle_since": "2026-12-01T00:00:00Z", "pinned": false, "held": false, "correction": {"prefill": 1, "decode": 1, "prefill_samples": 0, "decode_samples": 0}}], "controller": {"seq": 3, "confirmations": {"prefill_expand": 0, "prefill_consolidate": 0, "decode_expand": 0, "decode_consolidate": 0}, "evidence_window": {"opened_at": "2026-12-01T00:00:00Z", "arrivals": 0, "closed": false}}}`,
	} {
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		out, code := runBin(t, "serve", "--config", cfg)
		if code != 1 || !strings.Contains(out, file) || strings.Count(strings.TrimSpace(out), "\n") > 2 {
			t.Errorf("%s state file: exit %d, output:\n%s", name, code, out)
		}
		if name == "another fleet" && !strings.Contains(out, "another fleet") {
			t.Errorf("another fleet's file: %s", out)
		}
	}
}

// One process per state directory: a second narwhal serve on the same state.dir exits 1 naming
// the directory and the first one's pid, and changes nothing of its state; once the first has
// stopped, the directory is free again.
func TestServeOneProcessPerState(t *testing.T) {
	_, engines := startEngines(t, "prefill", "decode")
	cfg := writeConfig(t, e2eConfig(anyPort, anyPort, anyPort, engines))
	first := start(t, "serve", "--config", cfg)
	admin, _, _ := first.serving(t)
	waitFor(t, admin, 10*time.Second, "both engines active", allActive(2))
	out, code := runBin(t, "serve", "--config", cfg)
	pid := strconv.Itoa(first.cmd.Process.Pid)
	if code != 1 || !strings.Contains(out, "is held by another narwhal serve (pid "+pid+")") || !strings.Contains(out, "state.dir ") {
		t.Fatalf("a second serve on the same state: exit %d\n%s", code, out)
	}
	if c, _ := first.stop(t); c != 0 {
		t.Fatalf("the first exited %d", c)
	}
	again := start(t, "serve", "--config", cfg)
	again.serving(t)
	if c, _ := again.stop(t); c != 0 {
		t.Fatalf("the directory was not free after the first stopped: exit %d", c)
	}
}

// With state.dir left empty the state goes under the user's state home ($XDG_STATE_HOME/narwhal
// here), an absolute path the start line prints, whatever the working directory; a state file
// where the old default kept it (./narwhal-state) is pointed at, not restored silently.
func TestServeDefaultStateDir(t *testing.T) {
	home := t.TempDir()
	work := t.TempDir()
	legacy := filepath.Join(work, "narwhal-state")
	if err := os.MkdirAll(legacy, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(legacy, "narwhal-state.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(work, "narwhal.yaml")
	yaml := fmt.Sprintf("listen: {admin: %q, extproc: %q, xds: %q}\n", anyPort, anyPort, anyPort) +
		"engines:\n  - {id: a, address: \"127.0.0.1:1\", role: prefill}\n  - {id: b, address: \"127.0.0.1:2\", role: decode}\n"
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startWith(t, func(cmd *exec.Cmd) {
		cmd.Dir = work
		cmd.Env = append(os.Environ(), "XDG_STATE_HOME="+home)
	}, "serve", "--config", cfg)
	out := p.out
	want := filepath.Join(home, "narwhal")
	if got := logged(t, out, "narwhal serving", "state_dir")[0]; got != want {
		t.Fatalf("state_dir %q, want %q", got, want)
	}
	if !strings.Contains(out.String(), "a durable state is in ./narwhal-state") || !strings.Contains(out.String(), "old="+filepath.Join(legacy, "narwhal-state.json")) {
		t.Fatalf("no word of the state in ./narwhal-state:\n%s", out.String())
	}
	if code, _ := p.stop(t); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	if _, err := os.Stat(filepath.Join(want, "narwhal-state.json")); err != nil {
		t.Fatalf("no state written under the state home: %v", err)
	}
}
