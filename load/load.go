// Package load replays a workload in real time through a live Narwhal and on to its engines,
// playing Envoy's part with package gateway: each request's headers and body go to Narwhal's
// ext_proc server, the request as Narwhal mutated it to the engine it names, and the response
// back through ext_proc, as the Envoy of `narwhal envoy-config` would (docs/load.md). It is what
// `narwhal load` and `make run` drive a fleet with where no Envoy runs.
package load

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/narwhal-llm/narwhal/admin"
	"github.com/narwhal-llm/narwhal/gateway"
	"github.com/narwhal-llm/narwhal/history"
	"github.com/narwhal-llm/narwhal/sim"
)

// Options configure a run.
type Options struct {
	// ExtProc is Narwhal's ext_proc address (listen.extproc); Mode the filter the gateway plays.
	ExtProc string
	Mode    gateway.Mode
	// Paths are the paths routed through Narwhal (router.paths); requests go to the first.
	Paths []string
	// Admin is the base URL of Narwhal's admin listener: Run waits up to ReadyWait for its
	// /readyz before the first request, and shows the split and each role change ("": neither).
	Admin     string
	ReadyWait time.Duration
	// ExtProcTLS and AdminTLS, when set, are the client side of TLS toward the ext_proc listener
	// and an https Admin (tls.extproc, tls.admin; docs/security.md): the CA to trust and, for
	// mutual TLS, the client certificate. Nil ExtProcTLS: plaintext ext_proc.
	ExtProcTLS, AdminTLS *tls.Config
	// TTFTS and TPOTS are the SLO a request is judged against (slo.ttft_s, slo.tpot_s).
	TTFTS, TPOTS float64
	// Model is the requests' model field.
	Model string
	// Every is the period of the progress line (0: 5 s); Progress receives the progress lines
	// and the role changes seen (nil: none).
	Every    time.Duration
	Progress io.Writer
	// Listener, when set, serves the gateway for other clients too (curl, a browser's fetch):
	// the run's own requests go through it. Nil: a loopback listener on a port the system picks.
	Listener net.Listener
}

// Summary is what a run saw, client-side.
type Summary struct {
	Sent     int `json:"sent"`     // requests sent
	Answered int `json:"answered"` // responses read to the end (any status)
	OK       int `json:"ok"`       // of them, status 200 with a first token
	// Statuses counts the answers that were not 200, by status (429, 503, 504…).
	Statuses map[int]int `json:"statuses,omitempty"`
	Failed   int         `json:"failed"` // no answer (connection refused, reset, cancelled)
	// Met is the OK requests within both SLOs; Attainment is Met over the requests answered or
	// failed (a rejection or a failure is a miss; requests still in flight do not count).
	Met        int     `json:"met"`
	Attainment float64 `json:"attainment"`
	// TTFT and TPOT are the OK requests' quantiles, seconds: TTFT from sending to the first
	// token, TPOT the time after it over the tokens after the first; null when there are none.
	TTFT *history.Quantiles `json:"ttft_s"`
	TPOT *history.Quantiles `json:"tpot_s"`
	// RoleChanges are the role changes the admin state showed during the run, in order.
	RoleChanges []string `json:"role_changes,omitempty"`
	WallS       float64  `json:"wall_s"`
}

// result is one request's outcome, client-side.
type result struct {
	status      int
	failed      bool
	ttft, tpot  float64
	outputToken int
}

// Run sends reqs at their arrival times (seconds from now) and returns when every request has
// been answered or has failed, or ctx ends (requests still in flight are then cancelled and
// count as failed). It fails when the gateway cannot reach Narwhal's ext_proc server at all.
func Run(ctx context.Context, reqs []sim.Request, o Options) (*Summary, error) {
	if len(o.Paths) == 0 {
		return nil, errors.New("load: no routed path")
	}
	admin := &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: o.AdminTLS}}
	defer admin.CloseIdleConnections()
	if err := waitReady(ctx, admin, o.Admin, o.ReadyWait); err != nil {
		return nil, err
	}
	gwOpts := []gateway.GatewayOption{gateway.WithRoutedPaths(o.Paths...)}
	if o.ExtProcTLS != nil {
		gwOpts = append(gwOpts, gateway.WithDialOptions(grpc.WithTransportCredentials(credentials.NewTLS(o.ExtProcTLS))))
	}
	gw, err := gateway.NewGateway(o.ExtProc, o.Mode, gwOpts...)
	if err != nil {
		return nil, fmt.Errorf("load: the ext_proc client for %s: %w", o.ExtProc, err)
	}
	defer gw.Close()
	lis := o.Listener
	if lis == nil {
		if lis, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, err
		}
	}
	srv := &http.Server{Handler: gw, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	defer func() {
		_ = srv.Close()
		<-served
	}()
	url := "http://" + lis.Addr().String() + o.Paths[0]
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, DisableCompression: true}}
	defer client.CloseIdleConnections()

	every := o.Every
	if every <= 0 {
		every = 5 * time.Second
	}
	r := &run{o: o, admin: admin, begin: time.Now(), results: make([]result, 0, len(reqs))}
	reqCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() { r.watch(ctx, done, every) })

	var wg sync.WaitGroup
	for i, q := range reqs {
		at := r.begin.Add(time.Duration(q.ArrivalS * float64(time.Second)))
		if !sleepUntil(ctx, at) {
			break
		}
		body := r.body(i, q)
		r.sent()
		wg.Go(func() { r.record(send(reqCtx, client, url, body)) })
	}
	wg.Wait()
	close(done)
	watch.Wait()
	return r.summary(), nil
}

// waitReady polls admin's /readyz until it answers 200, for up to wait ("" admin or 0 wait: no
// wait).
func waitReady(ctx context.Context, client *http.Client, admin string, wait time.Duration) error {
	if admin == "" || wait <= 0 {
		return nil
	}
	url := strings.TrimSuffix(admin, "/") + "/readyz"
	deadline := time.Now().Add(wait)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
			return fmt.Errorf("load: narwhal is not ready after %s (%s: %v): is narwhal serve running?", wait, url, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// sleepUntil waits until t; false when ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// run is the state of one Run.
type run struct {
	o     Options
	admin *http.Client // GET /narwhal/state, over TLS when Options.AdminTLS
	begin time.Time

	mu      sync.Mutex
	nsent   int
	results []result
	changes []string
	roles   map[string]string // the engines' roles at the last look
}

func (r *run) sent() {
	r.mu.Lock()
	r.nsent++
	r.mu.Unlock()
}

func (r *run) record(res result) {
	r.mu.Lock()
	r.results = append(r.results, res)
	r.mu.Unlock()
}

// filler is the text prompts are cut from: four bytes a token, as Narwhal and enginesim size
// text before any calibration.
var filler = strings.Repeat("lorem ipsum dolor sit amet, ", 4096)

// body is request i's JSON: a streamed completion with a prompt of q.InputTokens tokens (a
// unique head, so that no two prompts share a prefix) and max_tokens q.OutputTokens.
func (r *run) body(i int, q sim.Request) []byte {
	head := fmt.Sprintf("request %d: ", i)
	n := max(4*q.InputTokens-len(head), 0)
	var b strings.Builder
	b.WriteString(head)
	for n > 0 {
		k := min(n, len(filler))
		b.WriteString(filler[:k])
		n -= k
	}
	out := max(q.OutputTokens, 1)
	// Usage asked for, as a client that wants it does: vLLM streams usage only then, and
	// Narwhal's sizing calibrates from it (docs/load.md).
	js, _ := json.Marshal(map[string]any{"model": r.o.Model, "prompt": b.String(), "max_tokens": out, "stream": true,
		"stream_options": map[string]any{"include_usage": true}})
	return js
}

// send posts one request and reads its answer to the end.
func send(ctx context.Context, client *http.Client, url string, body []byte) result {
	begin := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return result{failed: true}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return result{failed: true}
	}
	defer resp.Body.Close()
	res := result{status: resp.StatusCode}
	var first, last time.Time
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// A token is a frame with text: not the usage frame (empty text, or no choices) that
		// may end a stream.
		if line := sc.Bytes(); !bytes.HasPrefix(line, []byte("data: {")) || !tokenText.Match(line) {
			continue
		}
		last = time.Now()
		if first.IsZero() {
			first = last
		}
		res.outputToken++
	}
	if sc.Err() != nil {
		return result{failed: true}
	}
	if !first.IsZero() {
		res.ttft = first.Sub(begin).Seconds()
		if res.outputToken > 1 {
			res.tpot = last.Sub(first).Seconds() / float64(res.outputToken-1)
		}
	}
	return res
}

// tokenText matches a stream frame that carries generated text (completions or chat).
var tokenText = regexp.MustCompile(`"(?:text|content)":"[^"]`)

// ok reports a 200 with a first token.
func (res result) ok() bool { return !res.failed && res.status == http.StatusOK && res.outputToken > 0 }

// met reports an OK request within both SLOs.
func (res result) met(ttft, tpot float64) bool {
	return res.ok() && res.ttft <= ttft && (res.outputToken <= 1 || res.tpot <= tpot)
}

// watch prints the progress line every period, and each role change the admin state shows,
// until done closes (one last line then) or ctx ends.
func (r *run) watch(ctx context.Context, done <-chan struct{}, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	from := 0 // the results the last line covered
	for {
		select {
		case <-done:
			r.progress(ctx, &from)
			return
		case <-ctx.Done():
			return
		case <-t.C:
			r.progress(ctx, &from)
		}
	}
}

// progress writes one progress line: sent, answered, TTFT p50/p99 and attainment of the
// requests answered since the last line and overall, and the current split.
func (r *run) progress(ctx context.Context, from *int) {
	split := r.look(ctx)
	r.mu.Lock()
	recent := slices.Clone(r.results[*from:])
	*from = len(r.results)
	sent, answered := r.nsent, len(r.results)
	all := r.summaryLocked()
	r.mu.Unlock()
	if r.o.Progress == nil {
		return
	}
	var ttfts []float64
	met := 0
	for _, res := range recent {
		if res.ok() {
			ttfts = append(ttfts, res.ttft)
		}
		if res.met(r.o.TTFTS, r.o.TPOTS) {
			met++
		}
	}
	line := fmt.Sprintf("load: %4.0f s  sent %d  answered %d", time.Since(r.begin).Seconds(), sent, answered)
	if len(recent) > 0 {
		q := sim.PercentilesOf(ttfts)
		line += fmt.Sprintf("  last %d: TTFT p50 %s p99 %s, attainment %.3f", len(recent), sim.SecondsText(q.At(50)), sim.SecondsText(q.At(99)), float64(met)/float64(len(recent)))
	}
	line += fmt.Sprintf("  overall attainment %.3f", all.Attainment)
	if split != "" {
		line += "  split " + split
	}
	fmt.Fprintln(r.o.Progress, line)
}

// look reads the admin state: the split ("2P/2D"), and each role change since the last look,
// printed and kept for the summary. "" when there is no admin URL or it did not answer.
func (r *run) look(ctx context.Context) string {
	if r.o.Admin == "" {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(r.o.Admin, "/")+"/narwhal/state", nil)
	if err != nil {
		return ""
	}
	resp, err := r.admin.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var st admin.State
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&st) != nil {
		return ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	roles := map[string]string{}
	for _, e := range st.Engines {
		roles[e.ID] = e.Role
		if was, ok := r.roles[e.ID]; ok && was != e.Role {
			c := fmt.Sprintf("%s %s → %s", e.ID, was, e.Role)
			if d := lastMove(st, e.ID); d != "" {
				c += " (" + d + ")"
			}
			r.changes = append(r.changes, fmt.Sprintf("%.0f s: %s", time.Since(r.begin).Seconds(), c))
			if r.o.Progress != nil {
				fmt.Fprintf(r.o.Progress, "load: %4.0f s  role change: %s\n", time.Since(r.begin).Seconds(), c)
			}
		}
	}
	r.roles = roles
	return fmt.Sprintf("%dP/%dD", st.Split.Prefill, st.Split.Decode)
}

// lastMove is the reason of the last decision in the state that moved engine, as "decision N:
// reason" ("" when none of the decisions shown did).
func lastMove(st admin.State, engine string) string {
	for _, d := range slices.Backward(st.Decisions) {
		for _, m := range d.Moves {
			if m.Engine == engine {
				return fmt.Sprintf("decision %d, %s: %s", d.Seq, d.Caller, d.Reason)
			}
		}
	}
	return ""
}

// summary is the run's summary.
func (r *run) summary() *Summary {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.summaryLocked()
	return &s
}

func (r *run) summaryLocked() Summary {
	s := Summary{Sent: r.nsent, RoleChanges: slices.Clone(r.changes), WallS: time.Since(r.begin).Seconds()}
	var ttft, tpot []float64
	for _, res := range r.results {
		switch {
		case res.failed:
			s.Failed++
			continue
		case res.ok():
			s.OK++
			ttft = append(ttft, res.ttft)
			if res.outputToken > 1 {
				tpot = append(tpot, res.tpot)
			}
		default:
			if s.Statuses == nil {
				s.Statuses = map[int]int{}
			}
			s.Statuses[res.status]++
		}
		s.Answered++
		if res.met(r.o.TTFTS, r.o.TPOTS) {
			s.Met++
		}
	}
	if n := s.Answered + s.Failed; n > 0 {
		s.Attainment = float64(s.Met) / float64(n)
	}
	s.TTFT, s.TPOT = sim.PercentilesOf(ttft), sim.PercentilesOf(tpot)
	return s
}

// WriteTable writes the summary as a small table.
func (s *Summary) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "sent %d, answered %d (ok %d", s.Sent, s.Answered, s.OK)
	for _, st := range slices.Sorted(maps.Keys(s.Statuses)) {
		fmt.Fprintf(w, ", %d × %d", s.Statuses[st], st)
	}
	fmt.Fprintf(w, "), failed %d, in %.0f s\n", s.Failed, s.WallS)
	fmt.Fprintf(w, "attainment %.3f (%d of %d within the SLO)\n", s.Attainment, s.Met, s.Answered+s.Failed)
	fmt.Fprintf(w, "TTFT p50 %s  p90 %s  p99 %s\n", sim.SecondsText(s.TTFT.At(50)), sim.SecondsText(s.TTFT.At(90)), sim.SecondsText(s.TTFT.At(99)))
	fmt.Fprintf(w, "TPOT p50 %s  p90 %s  p99 %s\n", sim.SecondsText(s.TPOT.At(50)), sim.SecondsText(s.TPOT.At(90)), sim.SecondsText(s.TPOT.At(99)))
	fmt.Fprintf(w, "role changes: %d\n", len(s.RoleChanges))
	for _, c := range s.RoleChanges {
		fmt.Fprintf(w, "  %s\n", c)
	}
}
