//go:build interop

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/internal/llmdtest"
	"github.com/narwhal-llm/narwhal/internal/poll"
	"github.com/narwhal-llm/narwhal/load"
)

// Interop tests run Narwhal with llm-d's own components as an llm-d user deploys them
// (docs/interop.md; `make test-interop` builds them): the vLLM emulator llm-d-inference-sim as
// every engine, and each decode engine behind llm-d's P/D routing sidecar, pd-sidecar, which
// takes x-prefiller-host-port, runs the prefill leg on that prefiller (max_tokens 1,
// kv_transfer_params do_remote_decode) and the decode leg on its own engine.

// pdFleet is two prefill emulators addressed directly and two decode emulators behind their
// sidecars, in Narwhal's config order e1, e2 (prefill), e3, e4 (decode).
type pdFleet struct {
	prefill, decode, sidecars []*llmdtest.Proc
}

func startPDFleet(t *testing.T) *pdFleet {
	t.Helper()
	tm := llmdtest.Timing{TimeToFirstToken: 20 * time.Millisecond, InterTokenLatency: 5 * time.Millisecond,
		KVTransfer: 5 * time.Millisecond, MaxNumSeqs: 64}
	f := &pdFleet{}
	for _, name := range []string{"p1", "p2"} {
		f.prefill = append(f.prefill, llmdtest.Sim(t, name, tm))
	}
	for _, name := range []string{"d1", "d2"} {
		d := llmdtest.Sim(t, name, tm)
		f.decode = append(f.decode, d)
		f.sidecars = append(f.sidecars, llmdtest.Sidecar(t, name+"-sidecar", d))
	}
	return f
}

// addresses are the engines' addresses as Narwhal's config names them: the prefill emulators,
// then the decode engines' sidecars.
func (f *pdFleet) addresses() []string {
	return []string{f.prefill[0].Addr, f.prefill[1].Addr, f.sidecars[0].Addr, f.sidecars[1].Addr}
}

// The happy path, proven from the engines' side: every request of a load through Narwhal is
// answered; with local prefill off each is placed disaggregated, and the prefill emulators
// served one prefill leg per request (vllm:request_success_total{finish_reason="remote_decode"})
// while the decode emulators finished every request. With auto (the default) a light load goes
// mostly local — llm-d's decode-only path, no x-prefiller-host-port, the sidecar passing the
// request to its own engine — and the prefill legs are exactly the disaggregated placements.
// narwhal load names the model the engines serve (their /v1/models) without --model, and asks
// for usage, which the emulator, like vLLM, streams only when asked: Narwhal's sizing
// calibrates on every request. (Before, load sent model narwhal-demo, which the emulator
// answers 404, and after 455 requests sizing had 1 sample.)
func TestInteropPDThroughSidecars(t *testing.T) {
	for _, local := range []string{"off", "auto"} {
		t.Run(local, func(t *testing.T) {
			f := startPDFleet(t)
			cfg := writeConfig(t, e2eConfig(anyPort, anyPort, anyPort, f.addresses())+"router: {local_prefill: "+local+"}\n")
			admin, extproc, _ := start(t, "serve", "--config", cfg).serving(t)
			waitFor(t, admin, 20*time.Second, "four active engines", allActive(4))

			sum, stderr, err := runLoad(cfg, admin, extproc, 10, 3)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(stderr, "load: model "+llmdtest.Model+" (GET /v1/models of engine e1") {
				t.Errorf("load did not name the engines' model:\n%s", stderr)
			}
			if sum.Sent < 20 || sum.OK != sum.Sent || sum.Failed != 0 {
				t.Fatalf("summary %+v\n%s", sum, stderr)
			}
			st, err := getStateAs[dispatchedView](admin)
			if err != nil {
				t.Fatal(err)
			}
			var legs, finished float64
			for _, p := range f.prefill {
				legs += p.Counter(t, "vllm:request_success_total", "finish_reason=remote_decode")
			}
			for _, d := range f.decode {
				finished += d.Counter(t, "vllm:request_success_total", "finish_reason=stop") + d.Counter(t, "vllm:request_success_total", "finish_reason=length")
			}
			d, l := st.Counters.Dispatched.Disaggregated, st.Counters.Dispatched.Local
			if d+l != uint64(sum.Sent) || legs != float64(d) || finished != float64(sum.Sent) || (local == "off") != (l == 0) {
				t.Fatalf("%d sent, %d placed disaggregated, %d local; the prefill emulators served %v prefill legs, the decode emulators finished %v", sum.Sent, d, l, legs, finished)
			}
			t.Logf("%d sent, %d placed disaggregated, %d local", sum.Sent, d, l)
			if n := st.samples(llmdtest.Model); n < sum.Sent*9/10 {
				t.Errorf("sizing calibrated on %d of %d requests: the streams carried no usage", n, sum.Sent)
			}
		})
	}
}

// dispatchedView is /narwhal/state's placements by kind and its sizing samples by model.
type dispatchedView struct {
	Counters struct {
		Dispatched struct {
			Disaggregated uint64 `json:"disaggregated"`
			Local         uint64 `json:"local"`
		} `json:"dispatched"`
	} `json:"counters"`
	Sizing []struct {
		Model   string `json:"model"`
		Samples int    `json:"samples"`
	} `json:"sizing"`
}

func (v dispatchedView) samples(model string) int {
	for _, s := range v.Sizing {
		if s.Model == model {
			return s.Samples
		}
	}
	return 0
}

// A dead prefill engine fails only itself: with p1 killed under load, the decode engines'
// sidecars answer the prefill legs they cannot run with a bodiless 502, which passive health
// counts against p1; p1 is failed (passively, and by its own probe), the decode engines stay
// active the whole time, and the requests after p1 is out are served. Before, the failures
// counted against the decode engines: both were failed in turn and clients got 503
// no_capacity (issue 33).
func TestInteropDeadPrefillerFailsOnlyItself(t *testing.T) {
	f := startPDFleet(t)
	// The default probes (one a second, three to fail): passive health sees the data path's
	// failures first, as it does in a deployment.
	yaml := strings.Replace(e2eConfig(anyPort, anyPort, anyPort, f.addresses()),
		"health: {interval_s: 0.1, timeout_s: 0.1, unhealthy_after: 3, healthy_after: 3, recover_s: 0.5}",
		"health: {interval_s: 1, timeout_s: 0.5, unhealthy_after: 3, healthy_after: 3, recover_s: 10}", 1)
	srv, sum, st := killUnderLoad(t, writeConfig(t, yaml), f.prefill[0], "e1")
	for _, id := range []string{"e2", "e3", "e4"} {
		if l := lifecycleOf(st, id); l != "active" {
			t.Errorf("%s is %s after e1 died", id, l)
		}
	}
	if failed := regexp.MustCompile(`engine=e[234] from=\S+ to=failed`).FindString(srv.out.String()); failed != "" {
		t.Errorf("a healthy engine was failed on the way (%s):\n%s", failed, srv.out.String())
	}
	if !regexp.MustCompile(`engine=e1 from=active to=failed`).MatchString(srv.out.String()) {
		t.Errorf("the log does not show e1 failed:\n%s", srv.out.String())
	}
	// What fails is what was on p1 when it died, and what was sent to it before the ejection:
	// a few requests, never a 503 for want of capacity.
	t.Logf("p1 killed under 20 req/s: %d of %d requests served, statuses %v", sum.OK, sum.Sent, sum.Statuses)
	if sum.Statuses[503] != 0 || sum.Sent-sum.OK > 15 {
		t.Errorf("%d of %d requests not served (statuses %v)", sum.Sent-sum.OK, sum.Sent, sum.Statuses)
	}
}

// A dead decode engine behind its sidecar is seen: the sidecar answers GET /health itself
// (200 whatever its engine does), so Narwhal probes the engine's own port (engines[].health,
// docs/interop.md) — or a path the sidecar passes to its engine (health.path: /v1/models). With
// d1 killed under load, e3 (its sidecar) is failed, by its probes as by passive health (the
// sidecar's JSON 503), and stays failed while d1 is gone; the other engines stay active and the
// requests after the ejection are served. (Probing the sidecar's /health, e3 came back while d1
// was gone: 83 of 104 served.)
func TestInteropDeadDecodeEngineBehindItsSidecar(t *testing.T) {
	for _, probe := range []string{"engine port", "passed-through path"} {
		t.Run(probe, func(t *testing.T) { deadDecodeEngine(t, startPDFleet(t), probe) })
	}
	t.Run("the sidecar's own /health", func(t *testing.T) { blindReadmission(t, startPDFleet(t)) })
}

// blindReadmission: probed on the sidecar's /health, which answers 200 for a dead engine, e3 is
// failed by the data path when d1 dies, readmitted by probes that never failed (unconfirmed),
// failed by the data path again, and then readmitted blind: /narwhal/state says so, each such
// readmission keeps its role whatever the pricing says, and each comes later than the one before
// (health.recover_s times the ejections), so the requests each costs grow rarer.
func blindReadmission(t *testing.T, f *pdFleet) {
	cfg := writeConfig(t, e2eConfig(anyPort, anyPort, anyPort, f.addresses()))
	srv, sum, _ := killUnderLoad(t, cfg, f.decode[0], "e3")
	admin, _, _ := srv.serving(t)
	type view struct {
		Engines []struct {
			ID, Role, Lifecycle, Sight string
		} `json:"engines"`
		Decisions []struct {
			Caller, Outcome, Reason string
		} `json:"decisions"`
	}
	var st view
	var readmissions []string
	if !poll.Within(30*time.Second, func() bool {
		var err error
		if st, err = getStateAs[view](admin); err != nil {
			return false
		}
		readmissions = readmissions[:0]
		for _, d := range st.Decisions {
			if d.Caller == "readmission" && strings.HasPrefix(d.Reason, "e3 readmitted") {
				readmissions = append(readmissions, d.Outcome+": "+d.Reason)
			}
		}
		return st.Engines[2].Lifecycle == "active" && st.Engines[2].Sight == "blind"
	}) {
		t.Fatalf("e3 not readmitted blind: %+v, readmissions %q", st.Engines, readmissions)
	}
	t.Logf("d1 killed under 20 req/s: %d of %d requests served, statuses %v; e3 readmitted %d times: %q", sum.OK, sum.Sent, sum.Statuses, len(readmissions), readmissions)
	// The first readmission (unconfirmed) may move its role; every one after is blind. (The
	// controller decides on a readmission it sees at a monitor pass: one made and undone between
	// two passes leaves no decision.)
	for i, r := range readmissions {
		if i > 0 && !strings.HasPrefix(r, "retained") {
			t.Errorf("a blind readmission of e3 moved its role: %s", r)
		}
	}
	// recover_s is 0.5 s here: over the 6 s of load and what follows, e3 is tried again with
	// 0.5, 1, 1.5, 2, ... s between tries, not every 0.5 s.
	if len(readmissions) > 8 {
		t.Errorf("e3 readmitted %d times: its recovery does not lengthen", len(readmissions))
	}
}

func deadDecodeEngine(t *testing.T, f *pdFleet, probe string) {
	yaml := e2eConfig(anyPort, anyPort, anyPort, f.addresses())
	switch probe {
	case "engine port":
		for i, s := range f.sidecars {
			_, port, _ := net.SplitHostPort(f.decode[i].Addr)
			yaml = strings.Replace(yaml, fmt.Sprintf("address: %q, role: decode}", s.Addr), fmt.Sprintf("address: %q, role: decode, health: {port: %s}}", s.Addr, port), 1)
		}
	default:
		yaml = strings.Replace(yaml, "health: {interval_s: 0.1,", "health: {path: /v1/models, interval_s: 0.1,", 1)
	}
	_, sum, st := killUnderLoad(t, writeConfig(t, yaml), f.decode[0], "e3")
	if l := lifecycleOf(st, "e3"); l != "failed" {
		t.Errorf("e3, whose engine is gone, is %s: its probe does not reach the engine", l)
	}
	for _, id := range []string{"e1", "e2", "e4"} {
		if l := lifecycleOf(st, id); l != "active" {
			t.Errorf("%s is %s after d1 died", id, l)
		}
	}
	t.Logf("d1 killed under 20 req/s: %d of %d requests served, statuses %v", sum.OK, sum.Sent, sum.Statuses)
	if sum.Statuses[503] > 5 || sum.Sent-sum.OK > 15 {
		t.Errorf("%d of %d requests not served (statuses %v)", sum.Sent-sum.OK, sum.Sent, sum.Statuses)
	}
}

// Preflight proves a handoff from the prefiller's side: through the sidecars each pair's check
// passes and names the prefill leg the prefiller served; with the decode emulators addressed
// directly — they ignore x-prefiller-host-port and do the whole request — every pair fails,
// saying so. (Before, both passed: the answer alone cannot tell, issue 33.) With each engine
// limited to the role it can play, only those pairs are made, though the controller moves roles
// (without the limit it would pair every engine both ways, and those pairs fail or hang).
func TestInteropPreflightProvesTheHandoff(t *testing.T) {
	f := startPDFleet(t)
	handoffs := func(yaml string) []preflightRow {
		t.Helper()
		out, _ := runBinOut(t, "preflight", "--config", writeConfig(t, yaml), "--json")
		var rows, hs []preflightRow
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("preflight --json: %v\n%s", err, out)
		}
		for _, r := range rows {
			if r.Check == "handoff" && r.Engine != "" {
				hs = append(hs, r)
			}
		}
		if len(hs) != 4 {
			t.Fatalf("%d handoff checks, want the 4 pairs:\n%s", len(hs), out)
		}
		return hs
	}
	// Each engine can play its role only (engines[].roles): a prefill engine has no sidecar to
	// decode for another, and a sidecar sends every prefill elsewhere. Preflight pairs those
	// roles alone, the controller moving roles or not.
	oneRole := strings.NewReplacer("role: prefill}", "role: prefill, roles: [prefill]}", "role: decode}", "role: decode, roles: [decode]}")
	for _, h := range handoffs(oneRole.Replace(e2eConfig(anyPort, anyPort, anyPort, f.addresses()))) {
		if !h.OK || !strings.Contains(h.Detail, "served its leg") {
			t.Errorf("through the sidecars, %s: %+v", h.Engine, h)
		}
	}
	direct := []string{f.prefill[0].Addr, f.prefill[1].Addr, f.decode[0].Addr, f.decode[1].Addr}
	for _, h := range handoffs(e2eConfig(anyPort, anyPort, anyPort, direct) + "controller: {advisory: true}\n") {
		if h.OK || !strings.Contains(h.Detail, "served no leg of it") || !strings.Contains(h.Detail, "P/D sidecar") {
			t.Errorf("decode engines addressed directly, %s passed: %+v", h.Engine, h)
		}
	}
}

// preflightRow is one row of narwhal preflight --json.
type preflightRow struct {
	Check  string `json:"check"`
	Engine string `json:"engine"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// runLoad runs narwhal load through the serve at admin and extproc (cfg its config): a step
// workload of rate req/s for durationS seconds, the model the engines serve. It returns the
// summary and load's stderr; an error when it exits other than 0.
func runLoad(cfg, admin, extproc string, rate, durationS int) (load.Summary, string, error) {
	var sum load.Summary
	report := filepath.Join(os.TempDir(), fmt.Sprintf("narwhal-interop-%d-%d.json", os.Getpid(), time.Now().UnixNano()))
	defer os.Remove(report)
	cmd := exec.Command(narwhalBin, "load", "--config", cfg, "--extproc", extproc, "--admin", "http://"+admin,
		"--synthetic", "step", "--factor", "1", "--synthetic-rate", strconv.Itoa(rate), "--synthetic-duration-s", strconv.Itoa(durationS),
		"--every-s", "1", "--report", report)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return sum, stderr.String(), fmt.Errorf("load: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	b, err := os.ReadFile(report)
	if err == nil {
		err = json.Unmarshal(b, &sum)
	}
	return sum, stderr.String(), err
}

// killUnderLoad starts narwhal serve on cfg, runs a load of 20 req/s for 6 s through it, kills
// victim once the load is under way and waits until Narwhal has failed engine id; it returns
// serve, the load's summary and the state once the load ended.
func killUnderLoad(t *testing.T, cfg string, victim *llmdtest.Proc, id string) (*proc, load.Summary, stateView) {
	t.Helper()
	srv := start(t, "serve", "--config", cfg)
	admin, extproc, _ := srv.serving(t)
	waitFor(t, admin, 20*time.Second, "four active engines", allActive(4))
	type result struct {
		sum load.Summary
		err error
	}
	done := make(chan result, 1)
	go func() {
		sum, _, err := runLoad(cfg, admin, extproc, 20, 6)
		done <- result{sum, err}
	}()
	waitFor(t, admin, 20*time.Second, "load under way", func(s stateView) bool { return s.Counters.Offers >= 20 })
	victim.Kill()
	waitFor(t, admin, 10*time.Second, id+" failed", func(s stateView) bool { return lifecycleOf(s, id) == "failed" })
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	st, err := getState(admin)
	if err != nil {
		t.Fatal(err)
	}
	return srv, r.sum, st
}

// observedView is /narwhal/state's engines with what their own metrics said (health.metrics).
type observedView struct {
	Engines []struct {
		ID         string  `json:"id"`
		BusyUntilS float64 `json:"busy_until_s"`
		Observed   *struct {
			Running         float64 `json:"running"`
			Foreign         int     `json:"foreign"`
			ForeignPrefillS float64 `json:"foreign_prefill_s"`
			UnservedLegs    int     `json:"unserved_legs"`
			NoHandoff       bool    `json:"no_handoff"`
		} `json:"observed"`
	} `json:"engines"`
}

// P/D that is not happening is noticed while serving: with the decode emulators addressed
// directly (no sidecar: they ignore x-prefiller-host-port and answer the whole request), the
// prefill emulators' finished counts stay flat while the requests named to them get their
// first tokens. /narwhal/state shows the prefill engines' unserved legs and the decode
// engines' no_handoff, and serve says so once per engine. Through the sidecars the same load
// leaves no mark. (Before, serve counted every request as disaggregated and said nothing.)
func TestInteropServeNoticesDecodeEnginesThatDoNotHandOff(t *testing.T) {
	f := startPDFleet(t)
	marks := func(addrs []string) (observedView, func() string) {
		t.Helper()
		cfg := writeConfig(t, e2eConfig(anyPort, anyPort, anyPort, addrs)+"controller: {advisory: true}\nrouter: {local_prefill: off}\n")
		srv := start(t, "serve", "--config", cfg)
		admin, extproc, _ := srv.serving(t)
		waitFor(t, admin, 20*time.Second, "four active engines", allActive(4))
		if _, stderr, err := runLoad(cfg, admin, extproc, 10, 4); err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		var st observedView
		// One more reading of every engine after the load (health.metrics.interval_s 2).
		if !poll.Within(10*time.Second, func() bool {
			var err error
			st, err = getStateAs[observedView](admin)
			n := 0
			for _, e := range st.Engines {
				if e.Observed != nil {
					n++
				}
			}
			marked := addrs[2] == f.sidecars[0].Addr // through the sidecars: nothing to wait for
			for _, e := range st.Engines {
				marked = marked || e.Observed != nil && e.Observed.NoHandoff
			}
			// the line follows the mark by a moment
			return err == nil && n == 4 && marked && (addrs[2] == f.sidecars[0].Addr || strings.Contains(srv.out.String(), "handoff check: this decode engine"))
		}) {
			raw, _ := getStateAs[map[string]any](admin)
			t.Fatalf("the engines' metrics were not read: %+v\n%s", raw["engines"], srv.out.String())
		}
		return st, srv.out.String
	}

	// The load is light: placement may keep to one pair. Every decode engine that was sent
	// requests is marked, and the prefill engines they named.
	st, logs := marks([]string{f.prefill[0].Addr, f.prefill[1].Addr, f.decode[0].Addr, f.decode[1].Addr})
	unserved, noHandoff := 0, 0
	for _, e := range st.Engines {
		if e.Observed.UnservedLegs >= 8 {
			unserved++
		}
		if e.Observed.NoHandoff {
			noHandoff++
			// The line follows the mark by a moment (logged once the reading is applied).
			if !poll.Within(5*time.Second, func() bool { return strings.Contains(logs(), "and check with narwhal preflight\" engine="+e.ID) }) {
				t.Errorf("%s is marked no_handoff without its log line:\n%s", e.ID, logs())
			}
		}
	}
	log := logs()
	if unserved == 0 || noHandoff == 0 || st.Engines[0].Observed.NoHandoff || st.Engines[1].Observed.NoHandoff {
		t.Errorf("directly addressed decode engines: %d prefill engines show unserved legs, %d decode engines no_handoff: %+v", unserved, noHandoff, st)
	}
	if n := strings.Count(log, "this decode engine does not use the prefill engines"); n != noHandoff {
		t.Errorf("the no-handoff line said %d times for %d marked engines:\n%s", n, noHandoff, log)
	}

	st, logs = marks(f.addresses())
	log = logs()
	for _, e := range st.Engines {
		if o := e.Observed; o.UnservedLegs != 0 || o.NoHandoff {
			t.Errorf("through the sidecars, %s is marked: %+v", e.ID, *o)
		}
	}
	if strings.Contains(log, "handoff check") {
		t.Errorf("through the sidecars the handoff check spoke:\n%s", log)
	}
}

// Load that does not come through Narwhal is seen in the engines' own metrics and counted: with
// 24 long requests sent straight to the prefill emulator p1, e1 reports them as foreign (its
// scheduler runs them, Narwhal placed none of them), its projected prefill work includes them,
// and the requests Narwhal places meanwhile go to p2: p2 serves nearly every prefill leg.
// (Before, Narwhal saw only its own requests and split the legs between the two.)
func TestInteropForeignLoadSteersPlacement(t *testing.T) {
	f := startPDFleet(t)
	cfg := writeConfig(t, e2eConfig(anyPort, anyPort, anyPort, f.addresses())+"controller: {advisory: true}\nrouter: {local_prefill: off}\n") // prefill legs to count
	admin, extproc, _ := start(t, "serve", "--config", cfg).serving(t)
	waitFor(t, admin, 20*time.Second, "four active engines", allActive(4))

	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()
	for range 24 {
		wg.Go(func() { directStream(f.prefill[0].Addr, stop) })
	}
	if !poll.Within(20*time.Second, func() bool {
		st, err := getStateAs[observedView](admin)
		return err == nil && st.Engines[0].Observed != nil && st.Engines[0].Observed.Foreign >= 20
	}) {
		st, _ := getStateAs[observedView](admin)
		t.Fatalf("e1's direct load is not seen as foreign: %+v", st.Engines[0])
	}
	before := [2]float64{f.prefill[0].Counter(t, "vllm:request_success_total", "finish_reason=remote_decode"),
		f.prefill[1].Counter(t, "vllm:request_success_total", "finish_reason=remote_decode")}
	sum, stderr, err := runLoad(cfg, admin, extproc, 10, 3)
	if err != nil || sum.OK != sum.Sent {
		t.Fatalf("%+v %v\n%s", sum, err, stderr)
	}
	p1 := f.prefill[0].Counter(t, "vllm:request_success_total", "finish_reason=remote_decode") - before[0]
	p2 := f.prefill[1].Counter(t, "vllm:request_success_total", "finish_reason=remote_decode") - before[1]
	if p1+p2 != float64(sum.Sent) || p2 < 0.9*float64(sum.Sent) {
		t.Fatalf("%d requests: p1 served %v prefill legs, p2 %v; want p2 nearly all", sum.Sent, p1, p2)
	}
}

// directStream sends one long streamed completion straight to an engine, again and again until
// stop is closed.
func directStream(addr string, stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-stop; cancel() }()
	body := `{"model":"` + llmdtest.Model + `","prompt":"` + strings.Repeat("a quiet direct request ", 200) + `","max_tokens":3000,"stream":true}`
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
}

// narwhal profile against llm-d's emulator, which prefills prompts together and reports a KV
// cache (1,024 blocks of 16 tokens) it does not bind at: the profile says the first, and takes
// for max_kv_tokens what ran rather than the reported 16,384. (Before, the trial's profile took
// 16,384 unchecked and said nothing of the prefills run together, 0.62-0.70 of the profiled
// time under load.)
func TestInteropProfileOfTheEmulator(t *testing.T) {
	tm := llmdtest.Timing{TimeToFirstToken: 20 * time.Millisecond, InterTokenLatency: 2 * time.Millisecond, MaxNumSeqs: 256}
	sim := llmdtest.Sim(t, "profiled", tm)
	out, code := runBinOut(t, "profile", "--engine", "http://"+sim.Addr, "--model", llmdtest.Model, "--budget-s", "20", "--max-prompt-tokens", "4096")
	t.Logf("exit %d\n%s", code, out)
	for _, want := range []string{"this engine prefills prompts together", "reports a KV cache of 16384 tokens, but batches holding"} {
		if !strings.Contains(out, want) {
			t.Errorf("the profile does not say %q", want)
		}
	}
	if m := regexp.MustCompile(`max_kv_tokens: (\d+)`).FindStringSubmatch(out); m == nil || m[1] == "16384" {
		t.Errorf("max_kv_tokens %v: want what ran, not the reported 16384", m)
	}
}
