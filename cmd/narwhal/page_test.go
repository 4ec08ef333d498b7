package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/narwhal-llm/narwhal/extproc/envoytest"
	"github.com/narwhal-llm/narwhal/gateway"
)

// browser starts headless Chromium (Debian's chromium, which `make browser` installs) for t.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("no chromium on PATH (make browser installs Debian's): %v", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true), chromedp.WindowSize(1000, 900))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelA() })
	return ctx
}

// consoleProblems collects the page's console errors and uncaught exceptions; the function it
// returns reads them.
func consoleProblems(t *testing.T, ctx context.Context) func() []string {
	t.Helper()
	var mu sync.Mutex
	var problems []string
	if err := chromedp.Listen(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError {
				problems = append(problems, fmt.Sprintf("console error: %v", e.Args))
			}
		case *runtime.EventExceptionThrown:
			problems = append(problems, fmt.Sprintf("exception: %s (line %d)", e.ExceptionDetails.Text, e.ExceptionDetails.LineNumber))
		}
	}); err != nil {
		t.Fatal(err)
	}
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(problems)
	}
}

// Issue 13, the live page in a real browser: against narwhal serve with four enginesim engines
// under load, the page at / loads with no console error, shows four engine tiles with their
// roles, and after an operator's drain the tile and the split timeline change within two
// seconds without a reload.
func TestPage(t *testing.T) {
	_, engines := startEngines(t, "prefill", "prefill", "decode", "decode")
	cfg := e2eConfig(anyPort, anyPort, anyPort, engines) + "admin: {history: {interval_s: 0.2}}\n"
	adminAddr, extprocAddr, _ := start(t, "serve", "--config", writeConfig(t, cfg)).serving(t)
	waitFor(t, adminAddr, 10*time.Second, "four active engines", allActive(4))
	steadyLoad(t, extprocAddr)

	ctx := browser(t)
	problems := consoleProblems(t, ctx)
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx, chromedp.Navigate("http://"+adminAddr+"/"), chromedp.WaitVisible(chromedp.ID("tile-e4"))); err != nil {
		t.Fatal(err)
	}
	roles, err := chromedp.Run(tctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll(".tile")].map(t => t.id + "=" + t.dataset.role + "/" + t.dataset.lifecycle)`))
	if err != nil {
		t.Fatal(err)
	}
	if want := "tile-e1=prefill/active tile-e2=prefill/active tile-e3=decode/active tile-e4=decode/active"; strings.Join(roles, " ") != want {
		t.Fatalf("tiles %v, want %s", roles, want)
	}
	// Each tile says what its engine's own metrics say (health.metrics, read every 2 s).
	engineSays := `[...document.querySelectorAll(".tile .o")].every(o => o.textContent.startsWith("engine: ") && o.textContent.includes(" run · "))`
	if _, err := chromedp.Run(tctx, chromedp.Poll[chromedp.Void](engineSays, chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		t.Fatalf("the tiles do not show the engines' metrics: %v", err)
	}
	// The timeline has samples with both decode engines live before the drain.
	lastDecode := `(() => { const p = document.querySelector("#split polyline[data-series=decode]"); if (!p) return ""; const pts = p.getAttribute("points").trim().split(" "); return pts[pts.length-1].split(",")[1]; })()`
	if _, err := chromedp.Run(tctx, chromedp.Poll[chromedp.Void](lastDecode+` !== ""`)); err != nil {
		t.Fatal(err)
	}
	before, err := chromedp.Run(tctx, chromedp.Evaluate[string](lastDecode))
	if err != nil {
		t.Fatal(err)
	}
	if code, err := httpPost("http://" + adminAddr + "/narwhal/engines/e4/drain"); err != nil || code != 200 {
		t.Fatalf("drain: %d %v", code, err)
	}
	drained := time.Now()
	wctx, wcancel := context.WithTimeout(tctx, 2*time.Second)
	defer wcancel()
	if err := chromedp.Do(wctx,
		chromedp.Poll[chromedp.Void](`document.querySelector("#tile-e4").dataset.lifecycle === "draining"`, chromedp.WithPollingInterval(50*time.Millisecond)),
		chromedp.Poll[chromedp.Void](lastDecode+` !== `+fmt.Sprintf("%q", before), chromedp.WithPollingInterval(50*time.Millisecond)),
	); err != nil {
		t.Fatalf("the tile and the timeline within 2 s of the drain: %v", err)
	}
	t.Logf("the page showed the drain %v after it", time.Since(drained).Round(10*time.Millisecond))
	if err := chromedp.Do(tctx, chromedp.Sleep(time.Second)); err != nil { // a second more of timeline in the picture
		t.Fatal(err)
	}
	shoot(t, tctx, "page.png")
	if p := problems(); len(p) > 0 {
		t.Fatalf("the page logged problems:\n%s", strings.Join(p, "\n"))
	}
}

// TestPageDemo is the README's picture: the page through the demo `make run` plays (the
// workload of scripts/run-local.sh, the embedded default's controller and profile, four
// enginesim engines), taken once the page shows what the README tells a newcomer to watch — a
// role change marked on the split chart, TTFT p99 over the SLO line before it and back under it
// after — with no axis label twice on a chart and no console error. make screenshot writes it
// to bin/page.png (NARWHAL_SCREENSHOT names the file); docs/page.png is a copy of one.
func TestPageDemo(t *testing.T) {
	_, engines := startEngines(t, "prefill", "prefill", "decode", "decode")
	cfg := writeConfig(t, e2eConfig(anyPort, anyPort, anyPort, engines))
	adminAddr, extprocAddr, _ := start(t, "serve", "--config", cfg).serving(t)
	waitFor(t, adminAddr, 10*time.Second, "four active engines", allActive(4))
	start(t, append([]string{"load", "--config", cfg, "--extproc", extprocAddr, "--admin", "http://" + adminAddr}, runWorkload(t)...)...)

	ctx := browser(t)
	problems := consoleProblems(t, ctx)
	tctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	if err := chromedp.Do(tctx, chromedp.Navigate("http://"+adminAddr+"/"), chromedp.WaitVisible(chromedp.ID("tile-e4"))); err != nil {
		t.Fatal(err)
	}
	// over: the first sample whose TTFT p99 is over the SLO; the move after it; then the last
	// samples, ten seconds of them, back under the SLO.
	shows := `(() => {
		const ss = state.samples, slo = state.slo && state.slo.ttft_s;
		if (!slo) return false;
		const p99 = s => s.ttft_s ? s.ttft_s.p99 : null;
		const over = ss.findIndex(s => p99(s) > slo);
		if (over < 0) return false;
		const at = new Date(ss[over].t).getTime() - 10000;
		const moved = state.decisions.some(d => d.moves && d.moves.length && decisionTime(d).getTime() >= at);
		const last = ss.slice(-Math.ceil(10 / (state.interval || 1)));
		return moved && document.querySelectorAll("#split .move").length > 0 && ss.length - over > last.length &&
			last.every(s => p99(s) != null && p99(s) < slo);
	})()`
	begun := time.Now()
	if _, err := chromedp.Run(tctx, chromedp.Poll[chromedp.Void](shows, chromedp.WithPollingInterval(time.Second), chromedp.WithPollingTimeout(4*time.Minute))); err != nil {
		st, _ := getState(adminAddr)
		t.Fatalf("the page did not show a move with TTFT over the SLO and back under it within %v: %v (split %+v, %d decisions)", time.Since(begun).Round(time.Second), err, st.Split, len(st.Decisions))
	}
	t.Logf("the page showed the move and the TTFT back under the SLO %v into the demo", time.Since(begun).Round(time.Second))
	// Each chart's axis labels, the time axis and the values, are each said once.
	dups, err := chromedp.Run(tctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("svg")].flatMap(svg => {
		const seen = new Set(), dup = [];
		const H = +svg.getAttribute("height");
		for (const x of svg.querySelectorAll("text")) {
			const axis = +x.getAttribute("y") === H - 4 ? "time" : +x.getAttribute("x") === 58 ? "value" : "";
			if (!axis) continue; // a series name, the SLO line's label, the axis title
			const k = axis + " " + x.textContent;
			if (seen.has(k)) dup.push(svg.id + " " + k);
			seen.add(k);
		}
		return dup; })`))
	if err != nil || len(dups) > 0 {
		t.Fatalf("labels said twice: %v %v", dups, err)
	}
	out := os.Getenv("NARWHAL_SCREENSHOT")
	if out == "" {
		shoot(t, tctx, "page-demo.png")
	} else {
		shootTo(t, tctx, out)
	}
	if p := problems(); len(p) > 0 {
		t.Fatalf("the page logged problems:\n%s", strings.Join(p, "\n"))
	}
}

// steadyLoad sends streamed completions through the Envoy-faithful gateway, ten a second, until the
// test ends.
func steadyLoad(t *testing.T, extprocAddr string) {
	t.Helper()
	_, hs := envoytest.StartGateway(t, extprocAddr, gateway.Mode{RequestBody: gateway.Buffered, ResponseBody: gateway.Streamed,
		AllowModeOverride: true, MessageTimeout: time.Minute, ReceivingNamespaces: []string{"envoy.lb"}})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond) // the load's pace
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			wg.Go(func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/completions",
					strings.NewReader(`{"model":"m","prompt":"`+strings.Repeat("word ", 400)+`","max_tokens":64,"stream":true}`))
				if resp, err := http.DefaultClient.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
	})
}

// Issue 13, the same charts offline: narwhal sim --plot FILE.html writes the live page with the
// replay's history (a policy a view) in /narwhal/history's shape. In the browser it loads with no
// console error, offers every policy, draws the split with one mark per decision that moved, and
// a click on a mark shows that decision: its reason, candidates and gates.
func TestSimPage(t *testing.T) {
	out, svg := filepath.Join(t.TempDir(), "sim.html"), filepath.Join(t.TempDir(), "sim.svg")
	for _, plot := range []string{out, svg} {
		if log, code := runBin(t, "sim", "--synthetic", "phases", "--synthetic-rate", "30", "--synthetic-duration-s", "600", "--phase-s", "200",
			"--policy", "narwhal,static", "--window-s", "30", "--plot", plot, "--report", filepath.Join(t.TempDir(), "r.json")); code != 0 {
			t.Fatalf("sim: exit %d\n%s", code, log)
		}
	}
	ctx := browser(t)
	problems := consoleProblems(t, ctx)
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx, chromedp.Navigate("file://"+out), chromedp.WaitVisible(chromedp.CSS("#split polyline"))); err != nil {
		t.Fatal(err)
	}
	policies, err := chromedp.Run(tctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#run option")].map(o => o.value)`))
	if err != nil || strings.Join(policies, ",") != "narwhal,static" {
		t.Fatalf("policies %v %v", policies, err)
	}
	marks, err := chromedp.Run(tctx, chromedp.Evaluate[int](`document.querySelectorAll("#split .move").length`))
	if err != nil || marks == 0 {
		t.Fatalf("%d role-change marks on the narwhal replay (a moving mix): %v", marks, err)
	}
	if err := chromedp.Do(tctx, chromedp.Evaluate[chromedp.Void](`document.querySelector("#split .move").dispatchEvent(new MouseEvent("click"))`),
		chromedp.WaitVisible(chromedp.ID("decision"))); err != nil {
		t.Fatal(err)
	}
	text, err := chromedp.Run(tctx, chromedp.Evaluate[string](`document.querySelector("#decision").innerText`))
	if err != nil || !strings.Contains(text, "Decision ") || !strings.Contains(text, "ttft_ratio") || !strings.Contains(text, "gate") {
		t.Fatalf("the decision shown: %q %v", text, err)
	}
	// The TTFT axis holds every p99 (nothing clamped) and the SLO; time is seconds from the start
	// of the replay, not a wall clock.
	fit, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`(() => { const top = +document.querySelector("#ttft").dataset.ymax;
		const p99 = Math.max(...state.samples.map(s => s.ttft_s ? s.ttft_s.p99 : 0)); return top >= p99 && top >= state.slo.ttft_s; })()`))
	if err != nil || !fit {
		t.Errorf("the TTFT axis does not hold every p99 and the SLO (%v)", err)
	}
	ticks, err := chromedp.Run(tctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#split text")].map(t => t.textContent).filter(s => / s$/.test(s))`))
	if err != nil || len(ticks) != 5 || ticks[4] != "600 s" && ticks[4] != "570 s" {
		t.Errorf("the split's time ticks %q (%v): want five, in seconds from the start", ticks, err)
	}
	shoot(t, tctx, "sim-page.png")
	// The SVG plot, as a browser draws it, for the artifacts.
	if err := chromedp.Do(tctx, chromedp.Navigate("file://"+svg), chromedp.WaitReady(chromedp.CSS("polyline"))); err != nil {
		t.Fatal(err)
	}
	shoot(t, tctx, "sim-plot.png")
	if p := problems(); len(p) > 0 {
		t.Fatalf("the page logged problems:\n%s", strings.Join(p, "\n"))
	}
}

// In advisory mode the page says so at the top.
func TestPageAdvisory(t *testing.T) {
	_, engines := startEngines(t, "prefill", "decode")
	cfg := e2eConfig(anyPort, anyPort, anyPort, engines) + "controller: {advisory: true}\nadmin: {history: {interval_s: 0.2}}\n"
	adminAddr, _, _ := start(t, "serve", "--config", writeConfig(t, cfg)).serving(t)
	ctx := browser(t)
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx, chromedp.Navigate("http://"+adminAddr+"/"), chromedp.WaitVisible(chromedp.ID("advisory"))); err != nil {
		t.Fatal(err)
	}
	text, err := chromedp.Run(tctx, chromedp.Evaluate[string](`document.querySelector("#advisory").innerText`))
	if err != nil || !strings.HasPrefix(text, "Advisory mode: the controller records the moves it would make and makes none.") {
		t.Fatalf("the banner: %q %v", text, err)
	}
}

// shoot saves a screenshot of the browser's page as name in $NARWHAL_ARTIFACTS (the tests'
// artifacts: look at each picture), or in the test's temporary directory.
func shoot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("NARWHAL_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shootTo(t, ctx, filepath.Join(dir, name))
}

// shootTo saves a full-page screenshot at path.
func shootTo(t *testing.T, ctx context.Context, path string) {
	t.Helper()
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(shot))
}
