package enginesim

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
)

// modelEvents records a Model's first tokens and ends.
type modelEvents struct {
	first, done map[uint64]time.Time
	generated   map[uint64]int
}

func (m *modelEvents) FirstToken(id uint64, at time.Time) { m.first[id] = at }
func (m *modelEvents) Finished(id uint64, at time.Time, n int) {
	m.done[id], m.generated[id] = at, n
}

// The simulator's engine is the server's engine: the same requests, sent together to a real
// enginesim over HTTP and submitted at the same arrivals to a Model in virtual time, make the
// same schedule — every step of the same kind, batch, KV, prompt and length, in order. With
// NARWHAL_REALTIME=1 (make check-long: on a quiet machine, since it times a real server) it
// also checks what the clients saw: TTFTs and mean TPOTs within a few percent of the Model's
// (the server adds loopback HTTP and timer lateness, about a millisecond).
// Chunked (a budget of 512 tokens: a prompt in two chunks beside the batch), likewise.
func TestModelMatchesTheServer(t *testing.T) {
	chunked := config.DefaultProfile()
	chunked.ChunkedPrefill = config.ChunkedPrefill{BudgetTokens: 512}
	for name, prof := range map[string]config.Profile{"unchunked": config.DefaultProfile(), "chunked": chunked} {
		t.Run(name, func(t *testing.T) { modelMatchesTheServer(t, prof) })
	}
}

func modelMatchesTheServer(t *testing.T, prof config.Profile) {
	const (
		n      = 12
		prompt = 1000 // tokens: 4,000 bytes
		output = 40
	)
	e := New(Options{Profile: prof, Model: "m"})
	rec := &lockedRecorder{}
	e.loop.setTracer(rec) // the engine's own arrival times: TTFT is counted from them
	srv := httptest.NewServer(e)
	defer srv.Close()
	defer e.Close()
	clients := make([]*http.Client, n)
	for i := range clients {
		tr := &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}
		defer tr.CloseIdleConnections()
		clients[i] = &http.Client{Transport: tr}
		resp, err := clients[i].Get(srv.URL + "/health") // a warm connection each
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":%d,"stream":true}`, strings.Repeat("a", 4*prompt), output)
	start := make(chan struct{})
	results := make([]observed, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { results[i] = streamOnce(clients[i], srv.URL+"/v1/completions", body, start) })
	}
	close(start)
	wg.Wait()
	sort.Slice(results, func(i, j int) bool { return results[i].id < results[j].id }) // the engine's arrival order
	rec.mu.Lock()
	arrival := map[uint64]time.Time{}
	for _, j := range rec.jobs {
		arrival[j.id] = j.arrival
	}
	rec.mu.Unlock()
	first := arrival[results[0].id]
	for _, o := range results {
		if o.err != nil || o.tokens != output || arrival[o.id].IsZero() {
			t.Fatalf("request %d: %d tokens, %v", o.id, o.tokens, o.err)
		}
	}

	ev := &modelEvents{first: map[uint64]time.Time{}, done: map[uint64]time.Time{}, generated: map[uint64]int{}}
	m := NewModel(prof, ModelOptions{Seed: 1}, ev)
	mrec := &recorder{}
	m.s.trace = mrec
	epoch := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var next time.Time
	busy := false
	for i, o := range results { // each at its arrival, relative to the first
		next, busy = m.Submit(epoch.Add(arrival[o.id].Sub(first)), Job{ID: uint64(i), Prompt: prompt, Output: output})
	}
	for busy {
		next, busy = m.Advance(next)
	}
	rec.mu.Lock()
	serverSteps := append([]stepRecord(nil), rec.steps...)
	rec.mu.Unlock()
	if len(serverSteps) != len(mrec.steps) {
		t.Fatalf("the server ran %d steps, the model %d", len(serverSteps), len(mrec.steps))
	}
	for k, a := range serverSteps {
		b := mrec.steps[k]
		// A step's length is the profile's, whatever the server's timer lateness (it moves a
		// step's start, never its length).
		if a.kind != b.kind || a.streams != b.streams || a.kvTokens != b.kvTokens || a.promptTokens != b.promptTokens ||
			a.end.Sub(a.start) != b.end.Sub(b.start) {
			t.Fatalf("step %d: server %+v (%v), model %+v (%v)", k, a, a.end.Sub(a.start), b, b.end.Sub(b.start))
		}
	}
	if os.Getenv("NARWHAL_REALTIME") == "" {
		return
	}
	var ttftErr, tpotErr float64
	for i, o := range results {
		vTTFT := ev.first[uint64(i)].Sub(epoch.Add(arrival[o.id].Sub(first))).Seconds()
		vTPOT := ev.done[uint64(i)].Sub(ev.first[uint64(i)]).Seconds() / (output - 1)
		rTTFT := o.first.Sub(arrival[o.id]).Seconds()
		rTPOT := o.last.Sub(o.first).Seconds() / (output - 1)
		if ev.generated[uint64(i)] != output {
			t.Fatalf("model request %d generated %d tokens", i, ev.generated[uint64(i)])
		}
		ttftErr = max(ttftErr, math.Abs(rTTFT-vTTFT)/vTTFT)
		tpotErr = max(tpotErr, math.Abs(rTPOT-vTPOT)/vTPOT)
		t.Logf("request %d: TTFT %.1f ms server, %.1f ms model; TPOT %.2f ms server, %.2f ms model", i, rTTFT*1e3, vTTFT*1e3, rTPOT*1e3, vTPOT*1e3)
	}
	// A few percent, and a TTFT allowance for loopback HTTP and timer lateness under -race.
	if ttftErr > 0.05+0.005/prof.Prefill.Seconds(prompt) || tpotErr > 0.05 {
		t.Fatalf("largest relative errors: TTFT %.1f%%, TPOT %.1f%%", 100*ttftErr, 100*tpotErr)
	}
}

// A prompt whose leading blocks the engine prefilled before prefills only the rest; the cache
// counts what it served.
func TestPrefixCacheShortensPrefill(t *testing.T) {
	prof := config.DefaultProfile()
	ev := &modelEvents{first: map[uint64]time.Time{}, done: map[uint64]time.Time{}, generated: map[uint64]int{}}
	m := NewModel(prof, ModelOptions{PrefixBlocks: 16, BlockTokens: 1024}, ev)
	epoch := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	run := func(at time.Time, id uint64, prefix []uint64) time.Duration {
		next, busy := m.Submit(at, Job{ID: id, Prompt: 4096, Output: 1, Prefix: prefix})
		for busy {
			next, busy = m.Advance(next)
		}
		return ev.first[id].Sub(at)
	}
	cold := run(epoch, 1, []uint64{11, 12, 13, 14})
	warm := run(epoch.Add(time.Second), 2, []uint64{11, 12, 13, 14})
	half := run(epoch.Add(2*time.Second), 3, []uint64{11, 12, 99, 98})
	if want := config.Seconds(prof.Prefill.Seconds(4096)); (cold - want).Abs() > time.Microsecond {
		t.Fatalf("cold prefill %v, want %v", cold, want)
	}
	if want := config.Seconds(prof.Prefill.Seconds(1)); (warm - want).Abs() > time.Microsecond {
		t.Fatalf("warm prefill %v, want %v (the whole prefix cached)", warm, want)
	}
	if want := config.Seconds(prof.Prefill.Seconds(2048)); (half - want).Abs() > time.Microsecond {
		t.Fatalf("half-cached prefill %v, want %v", half, want)
	}
	if hit, prompt := m.PrefixHits(); hit != 4095+2048 || prompt != 3*4096 {
		t.Fatalf("cache served %d of %d prompt tokens", hit, prompt)
	}
}
