package main

// End-to-end tests of the narwhal binary: built once, run as real processes against real
// enginesim processes on loopback.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/internal/logbuf"
	"github.com/narwhal-llm/narwhal/internal/poll"
)

var narwhalBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "narwhal-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	narwhalBin = filepath.Join(dir, "narwhal")
	build := exec.Command("go", "build", "-o", narwhalBin, ".")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build narwhal:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// anyPort is a listen address on a port the system picks: processes under test bind it and log
// the address they got, so parallel runs never collide on a port.
const anyPort = "127.0.0.1:0"

// serving waits for narwhal serve's start line and returns the addresses it listens on.
func (p *proc) serving(t testing.TB) (admin, extproc, xds string) {
	t.Helper()
	a := logged(t, p.out, "narwhal serving", "admin", "extproc", "xds")
	return a[0], a[1], a[2]
}

// proc is a started narwhal process whose output is kept for failure messages.
type proc struct {
	cmd *exec.Cmd
	out *logbuf.Buffer
}

func start(t testing.TB, args ...string) *proc {
	t.Helper()
	return startWith(t, nil, args...)
}

// startWith is start with setup applied to the command first (its directory, its environment).
func startWith(t testing.TB, setup func(*exec.Cmd), args ...string) *proc {
	t.Helper()
	cmd := exec.Command(narwhalBin, args...)
	if setup != nil {
		setup(cmd)
	}
	out := &logbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, out: out}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() {
			t.Logf("narwhal %s output:\n%s", strings.Join(args, " "), out.String())
		}
	})
	return p
}

// stop sends SIGTERM and returns the exit code and how long the process took to exit.
func (p *proc) stop(t testing.TB) (int, time.Duration) {
	t.Helper()
	begin := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
		t.Fatalf("process ignored SIGTERM for 30 s")
	}
	return p.cmd.ProcessState.ExitCode(), time.Since(begin)
}

// writeConfig writes a file for one test; a Narwhal config (it has engines) without a state section gets a state
// directory of its own (the test's), so that no test restores another's roles.
func writeConfig(t testing.TB, yaml string) string {
	t.Helper()
	dir := t.TempDir()
	if strings.Contains(yaml, "engines:") && !strings.Contains(yaml, "\nstate:") && !strings.HasPrefix(yaml, "state:") {
		yaml += fmt.Sprintf("state: {dir: %q}\n", filepath.Join(dir, "state"))
	}
	path := filepath.Join(dir, "narwhal.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// serveActive starts engines of the given roles and narwhal serve on e2eConfig, waits until
// every engine is active, and returns the admin address.
func serveActive(t testing.TB, roles ...string) string {
	t.Helper()
	_, engines := startEngines(t, roles...)
	admin, _, _ := start(t, "serve", "--config", writeConfig(t, e2eConfig(anyPort, anyPort, anyPort, engines))).serving(t)
	waitFor(t, admin, 10*time.Second, fmt.Sprintf("%d active engines", len(roles)), allActive(len(roles)))
	return admin
}

// e2eConfig is a config for four engines at the given addresses, with fast health timing.
func e2eConfig(admin, extproc, xds string, engines []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: {admin: %q, extproc: %q, xds: %q}\n", admin, extproc, xds)
	b.WriteString("health: {interval_s: 0.1, timeout_s: 0.1, unhealthy_after: 3, healthy_after: 3, recover_s: 0.5}\n")
	b.WriteString("shutdown_grace_s: 5\nengines:\n")
	for i, a := range engines {
		role := "prefill"
		if i >= len(engines)/2 {
			role = "decode"
		}
		fmt.Fprintf(&b, "  - {id: e%d, address: %q, role: %s}\n", i+1, a, role)
	}
	return b.String()
}

type engineView struct {
	ID        string `json:"id"`
	Address   string `json:"address"`
	Role      string `json:"role"`
	Lifecycle string `json:"lifecycle"`
	Pinned    bool   `json:"pinned"`
	Drained   bool   `json:"drained"`
}

type stateView struct {
	Split   struct{ Prefill, Decode int } `json:"split"`
	Engines []engineView                  `json:"engines"`
	HA      struct {
		Role, ID, Leader string
		Revision         int64
	} `json:"ha"`
	Decisions []struct {
		Seq uint64 `json:"seq"`
	} `json:"decisions"`
	Counters struct {
		Offers     uint64 `json:"offers"`
		Dispatched struct {
			Local uint64 `json:"local"`
		} `json:"dispatched"`
	} `json:"counters"`
}

func getState(admin string) (stateView, error) { return getStateAs[stateView](admin) }

// getStateAs reads /narwhal/state into a T (a view of the fields a test reads, or a map).
func getStateAs[T any](admin string) (T, error) {
	var st T
	client, scheme := http.DefaultClient, "http://"
	if c, ok := adminTLS.Load(admin); ok { // a narwhal serving its admin over TLS
		client, scheme = c.(*http.Client), "https://"
	}
	resp, err := client.Get(scheme + admin + "/narwhal/state")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return st, fmt.Errorf("state: %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// adminTLS holds the https clients of admin addresses served over TLS (useAdminTLS), by address.
var adminTLS sync.Map

// useAdminTLS makes getStateAs and waitFor reach admin over https with client until the test
// ends.
func useAdminTLS(t testing.TB, admin string, client *http.Client) {
	adminTLS.Store(admin, client)
	t.Cleanup(func() { adminTLS.Delete(admin) })
}

// waitFor polls the state until cond holds; it fails the test after limit.
func waitFor(t testing.TB, admin string, limit time.Duration, what string, cond func(stateView) bool) stateView {
	t.Helper()
	var last stateView
	var err error
	if !poll.Within(limit, func() bool { last, err = getState(admin); return err == nil && cond(last) }) {
		t.Fatalf("%s: not within %v (last state %+v, err %v)", what, limit, last, err)
	}
	return last
}

func addressOf(st stateView, id string) string {
	for _, e := range st.Engines {
		if e.ID == id {
			return e.Address
		}
	}
	return ""
}

// allActive is a waitFor condition: n engines, all active.
func allActive(n int) func(stateView) bool {
	return func(s stateView) bool {
		active := 0
		for _, e := range s.Engines {
			if e.Lifecycle == "active" {
				active++
			}
		}
		return len(s.Engines) == n && active == n
	}
}

func lifecycleOf(st stateView, id string) string {
	for _, e := range st.Engines {
		if e.ID == id {
			return e.Lifecycle
		}
	}
	return ""
}

// startEngine starts an enginesim process in role on a port the system picks and returns it
// with its address, once it serves.
func startEngine(t testing.TB, role string, extra ...string) (*proc, string) {
	t.Helper()
	p := startEngineAt(t, anyPort, role, extra...)
	return p, logged(t, p.out, "enginesim serving", "addr")[0]
}

// startEngineAt starts an enginesim process on addr (an engine restarting where it was) and
// waits until it serves.
func startEngineAt(t testing.TB, addr, role string, extra ...string) *proc {
	t.Helper()
	p := start(t, append([]string{"enginesim", "--listen", addr, "--role", role}, extra...)...)
	got := logged(t, p.out, "enginesim serving", "addr")[0]
	resp, err := http.Get("http://" + got + "/health") // it listens before it logs
	if err != nil {
		t.Fatalf("enginesim on %s: %v", got, err)
	}
	resp.Body.Close()
	return p
}

// startEngines starts one engine per role and returns the processes and their addresses.
func startEngines(t testing.TB, roles ...string) ([]*proc, []string) {
	t.Helper()
	procs, addrs := make([]*proc, len(roles)), make([]string, len(roles))
	for i, r := range roles {
		procs[i], addrs[i] = startEngine(t, r)
	}
	return procs, addrs
}

// TestServeHealthEndToEnd runs narwhal serve against four enginesim processes, kills one, and
// restarts it: the engine is failed within unhealthy_after × interval_s (+ one interval, plus
// a margin for a loaded machine), then comes back through recovering to active.
func TestServeHealthEndToEnd(t *testing.T) {
	procs, engines := startEngines(t, "prefill", "prefill", "decode", "decode")
	// e4 is configured by host name: narwhal resolves it to IP:port.
	named := append([]string(nil), engines...)
	named[3] = "localhost" + named[3][strings.LastIndexByte(named[3], ':'):]
	srv := start(t, "serve", "--config", writeConfig(t, e2eConfig(anyPort, anyPort, anyPort, named)))
	admin, _, _ := srv.serving(t)
	st := waitFor(t, admin, 10*time.Second, "four active engines", allActive(4))
	if st.Split.Prefill != 2 || st.Split.Decode != 2 {
		t.Fatalf("split %+v, want 2/2", st.Split)
	}
	if a := addressOf(st, "e4"); a != engines[3] {
		t.Fatalf("e4 (configured %s) has address %q, want the resolved %s", named[3], a, engines[3])
	}
	// The default admin API (loopback, no token) is no way in for a web page (docs/security.md):
	// a cross-origin drain is refused, and so is any call naming a host it does not serve.
	for _, c := range []struct {
		method, host, origin string
		want                 int
	}{{"POST", "", "http://evil.example", 403}, {"GET", "evil.example", "", 421}, {"POST", "evil.example", "", 421}} {
		req, _ := http.NewRequest(c.method, "http://"+admin+"/narwhal/engines/e1/drain", nil)
		if c.method == "GET" {
			req.URL.Path = "/narwhal/state"
		}
		if c.host != "" {
			req.Host = c.host
		}
		if c.origin != "" {
			req.Header.Set("Origin", c.origin)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Fatalf("%s with Host %q, Origin %q: %d, want %d", c.method, c.host, c.origin, resp.StatusCode, c.want)
		}
	}
	if st, _ := getState(admin); lifecycleOf(st, "e1") != "active" {
		t.Fatalf("a refused call drained e1: %+v", st)
	}

	// Kill e3 (SIGKILL: no goodbye) and time how long narwhal takes to call it failed.
	_ = procs[2].cmd.Process.Kill()
	_ = procs[2].cmd.Wait()
	killed := time.Now()
	waitFor(t, admin, 5*time.Second, "e3 failed", func(s stateView) bool { return lifecycleOf(s, "e3") == "failed" })
	took := time.Since(killed)
	// unhealthy_after × interval_s + one interval = 0.4 s; real processes on a shared machine
	// get 1 s of margin (the exact bound is asserted in virtual time in package controller).
	if took > 1400*time.Millisecond {
		t.Fatalf("e3 failed %v after it died, want about 0.4 s", took)
	}
	if st, _ := getState(admin); st.Split.Decode != 1 || lifecycleOf(st, "e4") != "active" {
		t.Fatalf("after e3 failed: %+v", st)
	}

	// Restart it on the same address: recovering, then active.
	procs[2] = startEngineAt(t, engines[2], "decode")
	waitFor(t, admin, 5*time.Second, "e3 recovering", func(s stateView) bool {
		l := lifecycleOf(s, "e3")
		return l == "recovering" || l == "active"
	})
	waitFor(t, admin, 5*time.Second, "e3 active again", func(s stateView) bool { return lifecycleOf(s, "e3") == "active" })

	if code, took := srv.stop(t); code != 0 || took > 5*time.Second {
		t.Fatalf("serve exited %d after %v on SIGTERM, want 0 within shutdown_grace_s", code, took)
	}
	if !strings.Contains(srv.out.String(), `to=failed`) || !strings.Contains(srv.out.String(), `to=recovering`) {
		t.Fatalf("the log does not show the lifecycle changes:\n%s", srv.out.String())
	}
}

func TestServeErrors(t *testing.T) {
	// Port already in use: one clear line, exit 1.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// (The engine is never contacted: serve stops at its listeners.)
	cfg := writeConfig(t, e2eConfig(ln.Addr().String(), anyPort, anyPort, []string{"127.0.0.1:1"})+"controller: {min_prefill: 0, min_decode: 1}\n")
	out, code := runBin(t, "serve", "--config", cfg)
	if code != 1 || !strings.Contains(out, "listen.admin "+ln.Addr().String()) || !strings.Contains(out, "address already in use") {
		t.Fatalf("port in use: exit %d, output %q", code, out)
	}
	if lines := strings.Count(strings.TrimSpace(out), "\n") + 1; lines != 1 {
		t.Fatalf("port in use printed %d lines:\n%s", lines, out)
	}
	// The ext_proc port in use: the same, naming listen.extproc.
	cfg = writeConfig(t, e2eConfig(anyPort, ln.Addr().String(), anyPort, []string{"127.0.0.1:1"})+"controller: {min_prefill: 0, min_decode: 1}\n")
	out, code = runBin(t, "serve", "--config", cfg)
	if code != 1 || !strings.Contains(out, "listen.extproc "+ln.Addr().String()) {
		t.Fatalf("ext_proc port in use: exit %d, output %q", code, out)
	}
	// An admin API reachable from other machines without a token: refused, one line saying how
	// to fix it, exit 2; with the token in an environment variable that is not set: the same.
	cfg = writeConfig(t, e2eConfig("0.0.0.0:0", anyPort, anyPort, []string{"127.0.0.1:1"})+"controller: {min_prefill: 0, min_decode: 1}\n")
	out, code = runBin(t, "serve", "--config", cfg)
	if code != 2 || !strings.Contains(out, "listen.admin: 0.0.0.0:0 is reachable from other machines and the admin API has no token: set admin.token") {
		t.Fatalf("open admin: exit %d, output %q", code, out)
	}
	cfg = writeConfig(t, e2eConfig("0.0.0.0:0", anyPort, anyPort, []string{"127.0.0.1:1"})+"controller: {min_prefill: 0, min_decode: 1}\nadmin: {token_env: NARWHAL_E2E_UNSET_TOKEN}\n")
	out, code = runBin(t, "serve", "--config", cfg)
	if code != 2 || !strings.Contains(out, "NARWHAL_E2E_UNSET_TOKEN is not set") {
		t.Fatalf("token variable unset: exit %d, output %q", code, out)
	}
	// A token anyone could guess, from wherever it comes: refused before serving, exit 2, with
	// the way to make one, and without repeating it.
	t.Setenv("NARWHAL_E2E_WEAK_TOKEN", "change-me")
	cfg = writeConfig(t, e2eConfig("0.0.0.0:0", anyPort, anyPort, []string{"127.0.0.1:1"})+"controller: {min_prefill: 0, min_decode: 1}\nadmin: {token_env: NARWHAL_E2E_WEAK_TOKEN}\n")
	out, code = runBin(t, "serve", "--config", cfg)
	if code != 2 || !strings.Contains(out, "the token is a placeholder: make one with `openssl rand -hex 32`") || strings.Contains(out, "change-me") {
		t.Fatalf("weak token: exit %d, output %q", code, out)
	}
	// Unreadable config: exit 2.
	out, code = runBin(t, "serve", "--config", filepath.Join(t.TempDir(), "missing.yaml"))
	if code != 2 || !strings.Contains(out, "missing.yaml") {
		t.Fatalf("missing config: exit %d, output %q", code, out)
	}
}

func runBin(t testing.TB, args ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	code := runBinTo(t, &out, &out, args...)
	return out.String(), code
}

// runBinOut runs the binary and returns its stdout alone (what a pipe would get), and its exit code.
func runBinOut(t testing.TB, args ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	code := runBinTo(t, &out, io.Discard, args...)
	return out.String(), code
}

func runBinTo(t testing.TB, stdout, stderr io.Writer, args ...string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, narwhalBin, args...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	err := cmd.Run()
	if err != nil && cmd.ProcessState == nil {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode()
}

func TestValidateCommand(t *testing.T) {
	if out, code := runBin(t, "validate"); code != 0 || strings.TrimSpace(out) != "ok" {
		t.Fatalf("validate (embedded default): exit %d, %q", code, out)
	}
	bad := writeConfig(t, "controller:\n  thresholds:\n    dwell_s: -5\nrouter:\n  pathz: []\n")
	out, code := runBin(t, "validate", "--config", bad)
	if code != 2 {
		t.Fatalf("bad config: exit %d, output %q", code, out)
	}
	for _, want := range []string{"controller.thresholds.dwell_s: must be >= 0, got -5", "router.pathz: unknown key"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if out, code := runBin(t, "version"); code != 0 || !strings.HasPrefix(out, "narwhal ") {
		t.Fatalf("version: %d %q", code, out)
	}
	if _, code := runBin(t, "serve", "--no-such-flag"); code != 2 {
		t.Fatalf("unknown flag: exit %d, want 2", code)
	}
}

// TestRunScriptMatchesDefault keeps scripts/run-local.sh (what `make run` starts) in step with
// the engines of the embedded default config.
func TestRunScriptMatchesDefault(t *testing.T) {
	cfg, err := config.LoadDefault()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("../../scripts/run-local.sh")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, `"e`) {
			got = append(got, strings.Trim(line, `"`))
		}
	}
	var want []string
	for _, e := range cfg.Engines {
		want = append(want, e.ID+" "+e.Address+" "+e.Role)
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("run-local.sh starts\n%s\nbut the embedded default names\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestPrereqs runs the check `make run` and `make test` start with: one line for each missing
// prerequisite, exit 1 when the target cannot run without it, and nothing when all are there.
func TestPrereqs(t *testing.T) {
	script, err := filepath.Abs("../../scripts/prereqs.sh")
	if err != nil {
		t.Fatal(err)
	}
	sed, err := exec.LookPath("sed")
	if err != nil {
		t.Skip("no sed on PATH")
	}
	// bin holds sed and the given fake commands; PATH is bin alone.
	run := func(target string, fakes map[string]string) (string, int) {
		t.Helper()
		bin := t.TempDir()
		if err := os.Symlink(sed, filepath.Join(bin, "sed")); err != nil {
			t.Fatal(err)
		}
		for name, body := range fakes {
			if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command("/bin/sh", script, target)
		cmd.Env = []string{"PATH=" + bin}
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatal(err)
		}
		return string(out), cmd.ProcessState.ExitCode()
	}
	oldGo := map[string]string{"go": "echo go1.25.3"}
	if out, code := run("test", oldGo); code != 1 || !strings.Contains(out, "make test: chromium not found") || !strings.Contains(out, "make test: Go 1.25.3 found; the module needs 1.26") {
		t.Fatalf("make test without chromium (and apt-get), with Go 1.25: exit %d\n%s", code, out)
	}
	if out, code := run("run", nil); code != 1 || !strings.Contains(out, "make run: go not found") || !strings.Contains(out, "make run: bash not found") ||
		!strings.Contains(out, "make run: jq not found: only the README's examples") {
		t.Fatalf("make run with nothing: exit %d\n%s", code, out)
	}
	all := map[string]string{"go": "echo go1.26.0", "bash": "", "curl": "", "jq": "", "chromium": ""}
	for _, target := range []string{"run", "test"} {
		if out, code := run(target, all); code != 0 || out != "" {
			t.Fatalf("make %s with everything: exit %d\n%s", target, code, out)
		}
	}
}

// TestRunScript runs what `make run` runs: the script brings up narwhal and the four engines of
// the embedded default on their fixed ports, /narwhal/state shows four active engines (2
// prefill, 2 decode), narwhal load's requests go through Narwhal, an engine killed is reported
// and failed while the rest keep serving, and an interrupt stops every process.
func TestRunScript(t *testing.T) {
	// The script runs the embedded default, whose ports are fixed: a `make run` on this machine
	// holds them, and this test must not take them from it (nor fail for it).
	for _, addr := range []string{"127.0.0.1:9090", "127.0.0.1:9002", "127.0.0.1:18000", "127.0.0.1:8001",
		"127.0.0.1:8002", "127.0.0.1:8003", "127.0.0.1:8004", "127.0.0.1:8080"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Skipf("%s is in use (a make run?): the script needs the embedded default's ports", addr)
		}
		_ = ln.Close()
	}
	script, err := filepath.Abs("../../scripts/run-local.sh")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(script, narwhalBin)
	cmd.Dir = t.TempDir()
	// The embedded default keeps its state under the user's state home: the test's own.
	cmd.Env = append(os.Environ(), "XDG_STATE_HOME="+t.TempDir())
	out := &logbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // whatever is left of the group
		if t.Failed() {
			t.Logf("run-local.sh output:\n%s", out.String())
		}
	})
	st := waitFor(t, "127.0.0.1:9090", 20*time.Second, "make run: four active engines", allActive(4))
	if st.Split.Prefill != 2 || st.Split.Decode != 2 {
		t.Fatalf("split %+v, want 2/2", st.Split)
	}
	// Engines start active as configured; the engines are really up once the health monitor's
	// probes of each one succeed.
	poll.Until(t, 20*time.Second, "the health monitor seeing all four engines answer", func() bool {
		return probedOK(t, "127.0.0.1:9090", []string{"e1", "e2", "e3", "e4"}, 2)
	})
	if st, _ := getState("127.0.0.1:9090"); st.Split.Prefill != 2 || st.Split.Decode != 2 {
		t.Fatalf("after probes: %+v", st)
	}
	// The ext_proc and xDS listeners of the embedded default answer.
	for _, a := range []string{"127.0.0.1:9002", "127.0.0.1:18000"} {
		c, err := net.DialTimeout("tcp", a, 2*time.Second)
		if err != nil {
			t.Fatalf("make run: %s does not answer: %v", a, err)
		}
		_ = c.Close()
	}
	// narwhal load sends the demo workload through Narwhal: its offers climb.
	waitFor(t, "127.0.0.1:9090", 20*time.Second, "make run: requests through narwhal", func(st stateView) bool { return st.Counters.Offers >= 20 })
	// The README's request through the gateway narwhal load serves on :8080 streams tokens.
	resp, err := http.Post("http://127.0.0.1:8080/v1/completions", "application/json",
		strings.NewReader(`{"model":"m","prompt":"hello","max_tokens":8,"stream":true}`))
	if err != nil {
		t.Fatalf("the README's curl through :8080: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.Count(string(body), `"finish_reason":null`) != 8 {
		t.Fatalf("the README's curl through :8080: %d\n%s", resp.StatusCode, body)
	}
	// An engine killed: the script says so, Narwhal fails it and the rest keep serving.
	if err := exec.Command("pkill", "-f", "enginesim --listen 127.0.0.1:8004").Run(); err != nil {
		t.Fatalf("pkill e4: %v", err)
	}
	st = waitFor(t, "127.0.0.1:9090", 20*time.Second, "make run: e4 failed", func(st stateView) bool {
		return slices.ContainsFunc(st.Engines, func(e engineView) bool { return e.ID == "e4" && e.Lifecycle == "failed" })
	})
	waitFor(t, "127.0.0.1:9090", 20*time.Second, "make run: requests still flowing", func(s stateView) bool { return s.Counters.Offers >= st.Counters.Offers+20 })
	// (The engine finishes its in-flight streams before it exits.)
	if !poll.Within(20*time.Second, func() bool { return strings.Contains(out.String(), "engine e4 (127.0.0.1:8004) exited") }) {
		t.Fatalf("the script did not report e4's exit:\n%s", out.String())
	}
	if strings.Contains(out.String(), "stopping the rest") {
		t.Fatalf("the script stopped on e4's exit:\n%s", out.String())
	}
	// The restart hint names the role Narwhal has for e4 now (it may have moved since the start).
	if st, err := getState("127.0.0.1:9090"); err == nil {
		for _, e := range st.Engines {
			if hint := "enginesim --listen 127.0.0.1:8004 --role " + e.Role; e.ID == "e4" && !strings.Contains(out.String(), hint) {
				t.Fatalf("the restart hint does not say %q:\n%s", hint, out.String())
			}
		}
	}
	// Ctrl-C: the terminal interrupts the whole process group. The script stops everything and
	// says so once, not an "exited" line for each process the interrupt stopped.
	before := len(out.String())
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(40 * time.Second):
		t.Fatal("run-local.sh did not stop on SIGINT")
	}
	if after := out.String()[before:]; strings.Contains(after, "exited") || !strings.Contains(after, "narwhal: stopped") {
		t.Fatalf("after Ctrl-C the script said\n%s\nwant only that it stopped", after)
	}
	// Every process is gone: the ports are free again.
	for _, a := range []string{"127.0.0.1:9090", "127.0.0.1:9002", "127.0.0.1:18000", "127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003", "127.0.0.1:8004"} {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("%s still in use after the script stopped: %v", a, err)
		}
		_ = ln.Close()
	}
}

// probedOK reports whether every engine has at least n successful health probes in /metrics.
func probedOK(t testing.TB, admin string, engines []string, n float64) bool {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("metrics do not parse: %v", err)
	}
	ok := map[string]float64{}
	for _, m := range fams["narwhal_health_probes_total"].GetMetric() {
		var engine, result string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "engine":
				engine = l.GetValue()
			case "result":
				result = l.GetValue()
			}
		}
		if result == "ok" {
			ok[engine] = m.GetCounter().GetValue()
		}
	}
	for _, e := range engines {
		if ok[e] < n {
			return false
		}
	}
	return true
}

// TestEnvoyCommands: the examples are what `narwhal envoy-config` prints, and `narwhal validate
// --envoy` accepts each with its Narwhal config and rejects a broken one naming the field.
func TestEnvoyCommands(t *testing.T) {
	for _, c := range []struct {
		file string
		args []string
	}{
		{"envoy.yaml", nil},
		{"envoy-full-duplex.yaml", []string{"--body-mode", "FULL_DUPLEX_STREAMED"}},
		{"envoy-compose.yaml", []string{"--config", "../../examples/narwhal-compose.yaml", "--narwhal-host", "narwhal",
			"--tls-ca", "/etc/envoy/tls/ca.crt", "--tls-cert", "/etc/envoy/tls/envoy.crt", "--tls-key", "/etc/envoy/tls/envoy.key"}},
	} {
		out, code := runBin(t, append([]string{"envoy-config"}, c.args...)...)
		want, err := os.ReadFile("../../examples/envoy/" + c.file)
		if err != nil {
			t.Fatal(err)
		}
		if code != 0 || out != string(want) {
			t.Fatalf("envoy-config %v (exit %d) differs from examples/envoy/%s", c.args, code, c.file)
		}
		args := []string{"validate", "--envoy", "../../examples/envoy/" + c.file}
		if c.file == "envoy-compose.yaml" {
			args = append(args, "--config", "../../examples/narwhal-compose.yaml")
		}
		if out, code := runBin(t, args...); code != 0 || strings.TrimSpace(out) != "ok" {
			t.Fatalf("%v: exit %d %s", args, code, out)
		}
	}
	// Two replicas (issue 11): both in both clusters, and the result validates.
	out, code := runBin(t, "envoy-config", "--config", "../../examples/narwhal-compose.yaml", "--narwhal-hosts", "narwhal-a,narwhal-b",
		"--tls-ca", "/tls/ca.crt", "--tls-cert", "/tls/envoy.crt", "--tls-key", "/tls/envoy.key")
	if code != 0 || strings.Count(out, `{address: "narwhal-a"`) != 2 || strings.Count(out, `{address: "narwhal-b"`) != 2 {
		t.Fatalf("envoy-config --narwhal-hosts: exit %d\n%s", code, out)
	}
	two := writeConfig(t, out)
	if out, code := runBin(t, "validate", "--envoy", two, "--config", "../../examples/narwhal-compose.yaml"); code != 0 || strings.TrimSpace(out) != "ok" {
		t.Fatalf("validate the two-replica bootstrap: exit %d %s", code, out)
	}
	// The compose bootstrap does not fit the default config (Narwhal listens on 127.0.0.1 there).
	if out, code := runBin(t, "validate", "--envoy", "../../examples/envoy/envoy-compose.yaml"); code != 2 || !strings.Contains(out, "listen.extproc is 127.0.0.1:9002") {
		t.Fatalf("compose bootstrap against the default config: exit %d %s", code, out)
	}
	good, _ := os.ReadFile("../../examples/envoy/envoy.yaml")
	bad := writeConfig(t, strings.Replace(string(good), "request_body_mode: BUFFERED", "request_body_mode: STREAMED", 1))
	out, code = runBin(t, "validate", "--envoy", bad)
	if code != 2 || !strings.Contains(out, "processing_mode.request_body_mode: ") {
		t.Fatalf("STREAMED request body: exit %d %s", code, out)
	}
}

// listen.health serves the gRPC health service on a port of its own, plaintext, with the
// ext_proc listener's status, as the Gateway API Inference Extension's picker does (its
// charts probe port 9003 over gRPC): SERVING while serving, NOT_SERVING or gone once the
// shutdown begins (issue 34: only the ext_proc port answered).
func TestGRPCHealthPort(t *testing.T) {
	_, engines := startEngines(t, "prefill", "decode")
	cfg := strings.Replace(e2eConfig(anyPort, anyPort, anyPort, engines), "listen: {", `listen: {health: "127.0.0.1:0", `, 1)
	p := start(t, "serve", "--config", writeConfig(t, cfg))
	admin, _, _ := p.serving(t)
	addr := logged(t, p.out, "narwhal serving", "health")[0]
	waitFor(t, admin, 10*time.Second, "two active engines", allActive(2))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// "" and the names GIE's picker charts probe (liveness and readiness, inference-extension).
	for _, name := range []string{"", "liveness", "readiness", "inference-extension"} {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q on %s: %v %v", name, addr, resp, err)
		}
	}
	watch, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := watch.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v %v", r, err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The next word is NOT_SERVING, or the end of the stream (the server stops at once when
	// nothing is in flight): never SERVING again.
	if r, err := watch.Recv(); err == nil && r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("after SIGTERM: %v", r)
	}
}
