// Package llmdtest runs llm-d's own components as real processes for the interop tests
// (docs/interop.md): the vLLM emulator llm-d-inference-sim and the P/D routing sidecar
// pd-sidecar, the binaries `make llmd` builds from the Go module proxy (internal/llmd) into the
// user cache and names in NARWHAL_LLMD_SIM and NARWHAL_PD_SIDECAR.
package llmdtest

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/narwhal-llm/narwhal/internal/logbuf"
	"github.com/narwhal-llm/narwhal/internal/poll"
)

// Model is the model name every emulator serves.
const Model = "llama-interop"

// Binaries are the paths of the two programs, from the environment `make test-interop` sets.
func Binaries(t testing.TB) (sim, sidecar string) {
	t.Helper()
	sim, sidecar = os.Getenv("NARWHAL_LLMD_SIM"), os.Getenv("NARWHAL_PD_SIDECAR")
	for name, p := range map[string]string{"NARWHAL_LLMD_SIM": sim, "NARWHAL_PD_SIDECAR": sidecar} {
		if p == "" {
			t.Fatalf("%s is not set: run the interop tests with make test-interop, which builds llm-d's emulator and sidecar", name)
		}
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s: %v (make llmd builds it)", name, err)
		}
	}
	return sim, sidecar
}

// Proc is one running component: its address (127.0.0.1:port) and its output.
type Proc struct {
	Addr string
	Name string
	cmd  *exec.Cmd
	out  *logbuf.Buffer
	done chan struct{} // closed once the process has exited
	err  error         // Wait's, once done
}

// Timing is what an emulator's clock is set to (its flags of the same names).
type Timing struct {
	TimeToFirstToken, InterTokenLatency, KVTransfer time.Duration
	MaxNumSeqs                                      int
}

// Sim starts an emulator serving Model with timing on a port of its own and waits until it
// answers /health.
func Sim(t testing.TB, name string, tm Timing, extra ...string) *Proc {
	t.Helper()
	bin, _ := Binaries(t)
	args := []string{"--model", Model, "--max-num-seqs", strconv.Itoa(max(tm.MaxNumSeqs, 1)), "--max-model-len", "32768",
		"--time-to-first-token", tm.TimeToFirstToken.String(), "--inter-token-latency", tm.InterTokenLatency.String(),
		"--kv-cache-transfer-latency", tm.KVTransfer.String()}
	return startOnPort(t, name, bin, func(port int) []string { return append(append(args, extra...), "--port", strconv.Itoa(port)) })
}

// Sidecar starts a P/D routing sidecar in front of the emulator engine (plain HTTP both ways,
// the NIXL v2 connector, llm-d's default) and waits until it answers /health.
func Sidecar(t testing.TB, name string, engine *Proc) *Proc {
	t.Helper()
	_, bin := Binaries(t)
	_, enginePort, _ := net.SplitHostPort(engine.Addr)
	return startOnPort(t, name, bin, func(port int) []string {
		return []string{"--port", strconv.Itoa(port), "--vllm-port", enginePort, "--connector", "nixlv2", "--secure-proxy=false"}
	})
}

// startOnPort starts bin on a free port (args gives its flags for a port) and waits for its
// /health. Neither program takes a listener, so the port is one the system picked and then
// freed: another process may take it in between, and a start that fails on it is tried on
// another (three times).
func startOnPort(t testing.TB, name, bin string, args func(port int) []string) *Proc {
	t.Helper()
	var last error
	for range 3 {
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		p := &Proc{Addr: "127.0.0.1:" + strconv.Itoa(port), Name: name, out: &logbuf.Buffer{}, done: make(chan struct{})}
		p.cmd = exec.Command(bin, args(port)...)
		p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { p.err = p.cmd.Wait(); close(p.done) }()
		if last = p.awaitHealth(); last == nil {
			t.Cleanup(func() {
				p.Kill()
				if t.Failed() {
					t.Logf("%s (%s) output:\n%s", name, p.Addr, tail(p.out.String(), 4000))
				}
			})
			return p
		}
		p.Kill()
	}
	t.Fatalf("%s did not start: %v", name, last)
	return nil
}

// awaitHealth waits until the process answers GET /health 200, for up to 30 s.
func (p *Proc) awaitHealth() error {
	ok := func() bool {
		resp, err := http.Get("http://" + p.Addr + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		select {
		case <-p.done:
			return fmt.Errorf("exited (%v): %s", p.err, tail(p.out.String(), 600))
		case <-p.out.Changed():
		case <-time.After(poll.Interval):
		}
		if time.Now().After(deadline) {
			return errors.New("no /health within 30 s")
		}
	}
	return nil
}

// Kill stops the process at once (SIGKILL: an engine or a sidecar that dies).
func (p *Proc) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Counter sums the samples of a Prometheus counter on the process's /metrics whose labels
// include every given name=value pair.
func (p *Proc) Counter(t testing.TB, metric string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.Addr + "/metrics")
	if err != nil {
		t.Fatalf("%s /metrics: %v", p.Name, err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("%s /metrics: %v", p.Name, err)
	}
	var sum float64
next:
	for _, m := range fams[metric].GetMetric() {
		for _, l := range labels {
			k, v, _ := strings.Cut(l, "=")
			if !slices.ContainsFunc(m.GetLabel(), func(lp *dto.LabelPair) bool { return lp.GetName() == k && lp.GetValue() == v }) {
				continue next
			}
		}
		sum += m.GetCounter().GetValue() + m.GetUntyped().GetValue()
	}
	return sum
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
