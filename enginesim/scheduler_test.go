package enginesim

import (
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
)

// recorder is a tracer that keeps everything.
type recorder struct {
	steps []stepRecord
	jobs  []jobRecord
}

func (r *recorder) step(s stepRecord) { r.steps = append(r.steps, s) }
func (r *recorder) done(j jobRecord)  { r.jobs = append(r.jobs, j) }

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func ms(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Millisecond))) }

// coreProfile: prefill 10 ms + 1 ms/token; decode 2 ms + 1 ms/stream (no KV term).
func coreProfile(maxStreams, maxKV int) config.Profile {
	return config.Profile{
		Prefill: &config.PrefillCurve{BaseS: 0.010, PerTokenS: 0.001},
		Decode:  &config.DecodeCurve{BaseS: 0.002, PerStreamS: 0.001, MaxStreams: maxStreams, MaxKVTokens: maxKV},
	}
}

func newTestScheduler(p config.Profile) (*scheduler, *recorder) {
	s := newScheduler(p, 0, 1)
	r := &recorder{}
	s.trace = r
	return s, r
}

func TestSchedulerAggregateTimeline(t *testing.T) {
	s, rec := newTestScheduler(coreProfile(0, 0))
	a := newJob(1, 10, 3, true, false)
	b := newJob(2, 10, 2, true, false)
	s.submit(a, t0)
	if next, busy := s.submit(b, t0); !busy || !next.Equal(ms(20)) {
		t.Fatalf("after two arrivals: next %v busy %v, want %v", next.Sub(t0), busy, 20*time.Millisecond)
	}
	if sn := s.snapshot(); sn.running != 1 || sn.waiting != 1 {
		t.Fatalf("snapshot %+v: want 1 running (prefilling), 1 waiting", sn)
	}
	// Run to the end, calling advance exactly at each deadline.
	now := t0
	for {
		next, busy := s.advance(now)
		if !busy {
			break
		}
		now = next
	}
	type step struct {
		kind        stepKind
		start, end  float64
		streams, kv int
	}
	want := []step{
		{stepPrefill, 0, 20, 0, 0},  // A's prompt; B waits
		{stepPrefill, 20, 40, 0, 0}, // B's prompt: prefill goes before decoding A
		{stepDecode, 40, 44, 2, 22}, // A and B: 2 ms + 2×1 ms; KV 11+11
		{stepDecode, 44, 47, 1, 12}, // B finished after 2 tokens; A alone
	}
	if len(rec.steps) != len(want) {
		t.Fatalf("steps = %+v, want %d steps", rec.steps, len(want))
	}
	for i, w := range want {
		g := rec.steps[i]
		if g.kind != w.kind || !g.start.Equal(ms(w.start)) || !g.end.Equal(ms(w.end)) || g.streams != w.streams || g.kvTokens != w.kv {
			t.Errorf("step %d = {kind %d, %v..%v, streams %d, kv %d}, want %+v", i, g.kind,
				g.start.Sub(t0), g.end.Sub(t0), g.streams, g.kvTokens, w)
		}
	}
	if a.state != jobFinished || a.generated != 3 || b.state != jobFinished || b.generated != 2 {
		t.Errorf("a %v/%d, b %v/%d: want both finished with 3 and 2 tokens", a.state, a.generated, b.state, b.generated)
	}
	if a.firstStep != 1 || a.secondStep != 3 || a.lastStep != 4 {
		t.Errorf("a's token steps = %d,%d,%d, want 1,3,4", a.firstStep, a.secondStep, a.lastStep)
	}
	sn := s.snapshot()
	if sn.running != 0 || sn.waiting != 0 || sn.kvTokens != 0 || s.reserved != 0 {
		t.Errorf("after the end: %+v reserved %d, want all zero", sn, s.reserved)
	}
	if sn.counts.promptTokens != 20 || sn.counts.generationTokens != 5 || sn.counts.successLength != 2 {
		t.Errorf("counts %+v: want 20 prompt, 5 generated, 2 successes", sn.counts)
	}
}

func TestSchedulerSingleTokenFinishesAfterPrefill(t *testing.T) {
	s, rec := newTestScheduler(coreProfile(0, 0))
	j := newJob(1, 0, 1, true, false)
	s.submit(j, t0)
	if _, busy := s.advance(ms(10)); busy {
		t.Fatal("engine still busy after the only prefill")
	}
	if j.state != jobFinished || j.generated != 1 || len(rec.steps) != 1 || rec.steps[0].kind != stepPrefill {
		t.Fatalf("job %v/%d steps %+v: want finished by its prefill alone", j.state, j.generated, rec.steps)
	}
}

func TestSchedulerPrefilledJobSkipsPrefill(t *testing.T) {
	s, rec := newTestScheduler(coreProfile(0, 0))
	j := newJob(1, 100, 2, true, true)
	if next, _ := s.submit(j, t0); !next.Equal(ms(3)) {
		t.Fatalf("first step ends at %v, want a 3 ms decode step", next.Sub(t0))
	}
	s.advance(ms(3))
	if j.generated != 1 || j.firstStep != 1 {
		t.Fatalf("after the first decode step: generated %d first step %d, want the first token", j.generated, j.firstStep)
	}
	s.advance(ms(6))
	for _, st := range rec.steps {
		if st.kind != stepDecode {
			t.Fatalf("steps %+v: a remote-prefilled job must not be prefilled locally", rec.steps)
		}
	}
	if j.state != jobFinished || s.snapshot().counts.promptTokens != 0 {
		t.Fatalf("job %v, counts %+v", j.state, s.snapshot().counts)
	}
}

func TestSchedulerAbsoluteDeadlines(t *testing.T) {
	// A prefilled job alone decodes in 3 ms steps.
	s, _ := newTestScheduler(coreProfile(0, 0))
	j := newJob(1, 0, 100, true, true)
	s.submit(j, t0)

	// Called 0.5 ms late: the next step still ends on the 3 ms grid.
	if next, _ := s.advance(ms(3.5)); !next.Equal(ms(6)) || j.generated != 1 {
		t.Fatalf("late by 0.5 ms: next %v generated %d, want 6ms and 1", next.Sub(t0), j.generated)
	}
	// Called 8 ms late (more than two steps): one step completes on time, one catch-up step
	// ends now, and the next ends one step from now; no burst of tokens.
	next, _ := s.advance(ms(14))
	if j.generated != 3 || !next.Equal(ms(17)) {
		t.Fatalf("late by 8 ms: generated %d next %v, want 3 and 17ms", j.generated, next.Sub(t0))
	}
}

func TestSchedulerAdmissionLimits(t *testing.T) {
	t.Run("max_streams", func(t *testing.T) {
		s, rec := newTestScheduler(coreProfile(2, 0))
		var jobs []*job
		for i := range 5 {
			j := newJob(uint64(i+1), 4, 6, true, false)
			jobs = append(jobs, j)
			s.submit(j, t0)
		}
		now, maxRunning := t0, 0
		for {
			sn := s.snapshot()
			maxRunning = max(maxRunning, sn.running)
			next, busy := s.advance(now)
			if !busy {
				break
			}
			now = next
		}
		if maxRunning > 2 {
			t.Errorf("running reached %d with max_streams 2", maxRunning)
		}
		for _, st := range rec.steps {
			if st.kind == stepDecode && st.streams > 2 {
				t.Errorf("decode step %d had %d streams", st.seq, st.streams)
			}
		}
		for _, j := range jobs {
			if j.state != jobFinished {
				t.Errorf("job %d: %v, want finished", j.id, j.state)
			}
		}
	})
	t.Run("max_kv_tokens", func(t *testing.T) {
		s, _ := newTestScheduler(coreProfile(0, 100))
		a, b, c := newJob(1, 40, 10, true, false), newJob(2, 40, 10, true, false), newJob(3, 40, 10, true, false)
		for _, j := range []*job{a, b, c} {
			s.submit(j, t0)
		}
		s.advance(ms(50)) // A prefilled at 50 ms; B admitted (100 reserved); C does not fit
		if sn := s.snapshot(); sn.running != 2 || sn.waiting != 1 || s.reserved != 100 {
			t.Fatalf("snapshot %+v reserved %d: want 2 running, 1 waiting, 100 reserved", sn, s.reserved)
		}
	})
}

func TestSchedulerCancel(t *testing.T) {
	s, rec := newTestScheduler(coreProfile(0, 0))
	a := newJob(1, 10, 50, true, false) // prefill 0..20
	b := newJob(2, 10, 50, true, false)
	c := newJob(3, 10, 50, true, false)
	s.submit(a, t0)
	s.submit(b, t0)
	s.submit(c, t0)

	s.cancel(newJob(99, 1, 1, true, false), ms(1)) // never submitted: nothing to do
	if s.snapshot().counts.cancelled != 0 {
		t.Fatal("cancelling a job the scheduler never saw counted it")
	}
	s.cancel(c, ms(1)) // queued
	if sn := s.snapshot(); sn.waiting != 1 || c.state != jobCancelled {
		t.Fatalf("cancel queued: %+v, c %v", sn, c.state)
	}
	s.cancel(a, ms(2)) // prefilling: the step runs to its end, the job holds nothing
	if sn := s.snapshot(); sn.running != 0 || sn.waiting != 1 || sn.kvTokens != 0 || s.reserved != 0 {
		t.Fatalf("cancel prefilling: %+v reserved %d", sn, s.reserved)
	}
	s.advance(ms(40)) // step 1 (A's, cancelled) ends 20; B prefills 20..40
	if b.state != jobDecoding || b.generated != 1 {
		t.Fatalf("b %v/%d, want decoding after its prefill", b.state, b.generated)
	}
	s.advance(ms(43)) // one decode step
	s.cancel(b, ms(44))
	sn := s.snapshot()
	if sn.running != 0 || sn.kvTokens != 0 || s.reserved != 0 || len(s.batch) != 0 {
		t.Fatalf("cancel decoding: %+v reserved %d batch %d", sn, s.reserved, len(s.batch))
	}
	if sn.counts.cancelled != 3 || sn.counts.promptTokens != 10 {
		t.Errorf("counts %+v: want 3 cancelled, 10 prompt tokens (B only)", sn.counts)
	}
	if _, busy := s.advance(ms(100)); busy {
		t.Error("engine busy with nothing left")
	}
	if n := len(rec.jobs); n != 3 {
		t.Errorf("%d jobs traced, want 3", n)
	}
}

func TestSchedulerNoiseSeeded(t *testing.T) {
	p := coreProfile(0, 0)
	durations := func(sigma float64, seed int64) []time.Duration {
		s := newScheduler(p, sigma, seed)
		r := &recorder{}
		s.trace = r
		for i := range 5 {
			s.submit(newJob(uint64(i+1), 10, 1, true, false), t0)
		}
		now := t0
		for {
			next, busy := s.advance(now)
			if !busy {
				break
			}
			now = next
		}
		var d []time.Duration
		for _, st := range r.steps {
			d = append(d, st.end.Sub(st.start))
		}
		return d
	}
	a, b, c, exact := durations(0.2, 7), durations(0.2, 7), durations(0.2, 8), durations(0, 7)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("same seed, different durations: %v vs %v", a, b)
		}
		if exact[i] != 20*time.Millisecond {
			t.Fatalf("sigma 0: %v, want 20ms each", exact)
		}
	}
	same := true
	for i := range a {
		same = same && a[i] == c[i] && a[i] == exact[i]
	}
	if same {
		t.Errorf("noise had no effect: %v", a)
	}
}

func TestSchedulerFailAll(t *testing.T) {
	s, _ := newTestScheduler(coreProfile(0, 0))
	a, b := newJob(1, 10, 5, true, false), newJob(2, 10, 5, true, false)
	s.submit(a, t0)
	s.submit(b, t0)
	s.failAll()
	for _, j := range []*job{a, b} {
		if st, _ := j.observe(); st != jobFailed {
			t.Errorf("job %d published %v, want failed", j.id, st)
		}
	}
	if sn := s.snapshot(); sn.running != 0 || sn.waiting != 0 {
		t.Errorf("after failAll: %+v", sn)
	}
}

// runTo advances s to the end of its work, calling advance at each deadline.
func runTo(s *scheduler, now time.Time) time.Time {
	for {
		next, busy := s.advance(now)
		if !busy {
			return now
		}
		now = next
	}
}

// chunkedProfile is coreProfile with a step budget of budget tokens (vLLM's
// max_num_batched_tokens).
func chunkedProfile(budget int) config.Profile {
	p := coreProfile(0, 0)
	p.ChunkedPrefill = config.ChunkedPrefill{BudgetTokens: budget}
	return p
}

// A prompt that reaches an engine with a decode batch: unchunked, the batch waits the whole
// prefill (one 110 ms step, no token for the residents); chunked at a budget of 40 tokens,
// every step carries the batch's two tokens and a 38-token chunk (2 ms + 2×1 ms + 38 ms = 42 ms,
// the first 10 ms more for the curve's base, against a 4 ms decode step), so the residents keep
// decoding but their TPOT grows while the prompt is chunked in, and its first token comes with
// its last chunk (38 + 38 + 24).
func TestSchedulerChunkedPrefillBesideTheBatch(t *testing.T) {
	for _, c := range []struct {
		name   string
		prof   config.Profile
		steps  []stepRecord // from the prompt's arrival on; end - start in ms in kvTokens
		firstS float64      // the prompt's first token, ms from its first step's start
	}{
		{"unchunked", coreProfile(0, 0), []stepRecord{
			{kind: stepPrefill, promptTokens: 100, kvTokens: 110},
			{kind: stepDecode, streams: 3, kvTokens: 5},
		}, 110},
		{"chunked", chunkedProfile(40), []stepRecord{
			{kind: stepHybrid, streams: 2, promptTokens: 38, kvTokens: 52},
			{kind: stepHybrid, streams: 2, promptTokens: 38, kvTokens: 42},
			{kind: stepHybrid, streams: 2, promptTokens: 24, kvTokens: 28},
			{kind: stepDecode, streams: 3, kvTokens: 5},
		}, 52 + 42 + 28},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, rec := newTestScheduler(c.prof)
			s.submit(newJob(1, 10, 1000, true, true), t0) // prefilled elsewhere: residents at once
			s.submit(newJob(2, 10, 1000, true, true), t0)
			now := s.stepEnd
			s.advance(now) // the first decode step ends; the next begins
			arrival := now.Add(time.Millisecond)
			p := newJob(3, 100, 2, true, false)
			s.submit(p, arrival)
			for p.generated == 0 || len(rec.steps) == 0 || !rec.steps[len(rec.steps)-1].start.After(arrival) || rec.steps[len(rec.steps)-1].kind != stepDecode {
				next, _ := s.advance(now)
				now = next
			}
			var got []stepRecord
			for _, st := range rec.steps {
				if st.start.After(arrival) {
					got = append(got, st)
				}
			}
			if len(got) != len(c.steps) {
				t.Fatalf("%d steps after the arrival (%+v), want %d", len(got), got, len(c.steps))
			}
			for i, w := range c.steps {
				g := got[i]
				if took := g.end.Sub(g.start); g.kind != w.kind || g.streams != w.streams || g.promptTokens != w.promptTokens ||
					(took-time.Duration(w.kvTokens)*time.Millisecond).Abs() > time.Microsecond {
					t.Errorf("step %d: kind %d streams %d chunk %d took %v; want kind %d streams %d chunk %d took %d ms",
						i, g.kind, g.streams, g.promptTokens, took, w.kind, w.streams, w.promptTokens, w.kvTokens)
				}
			}
			first := got[len(got)-2].end.Sub(got[0].start)
			if want := time.Duration(c.firstS * float64(time.Millisecond)); (first - want).Abs() > time.Microsecond {
				t.Errorf("first token %v after the prompt's first step began, want %v", first, want)
			}
		})
	}
}

// Alone (no stream decoding), a chunked prompt takes what the prefill curve says: 250 tokens at a
// budget of 100 are three steps of 10 + 100, 100 and 50 ms (260 ms, as one step unchunked). A
// quadratic term splits by the tokens each chunk adds to the prompt so far.
func TestSchedulerChunkedPrefillAlone(t *testing.T) {
	s, rec := newTestScheduler(chunkedProfile(100))
	p := newJob(1, 250, 1, true, false)
	s.submit(p, t0)
	if end := runTo(s, t0); end != ms(260) || p.state != jobFinished || len(rec.steps) != 3 {
		t.Fatalf("ended at %v in %d steps (%v), want 260 ms in 3", end.Sub(t0), len(rec.steps), p.state)
	}
	quad := chunkedProfile(100)
	quad.Prefill = &config.PrefillCurve{BaseS: 0.010, PerTokenS: 0.001, PerToken2S: 1e-6}
	s, rec = newTestScheduler(quad)
	s.submit(newJob(1, 250, 1, true, false), t0)
	runTo(s, t0)
	var total time.Duration
	for _, st := range rec.steps {
		total += st.end.Sub(st.start)
	}
	// one base + 250 ms + 250² µs, each step its own rounding to the nanosecond.
	if want := 10*time.Millisecond + 250*time.Millisecond + 62500*time.Microsecond; (total - want).Abs() > 3*time.Nanosecond {
		t.Errorf("chunks took %v, want %v", total, want)
	}
}

// Chunked, prompts share a step's budget in FIFO order (two short ones in one step); a prompt
// waits while those before it take the budget, and nothing overtakes it (a request prefilled
// elsewhere behind it waits too); a prompt cancelled while it is chunked in leaves after the step
// under way and holds nothing; a full batch leaves no budget for a chunk, and the prompt waits.
func TestSchedulerChunkedPrefillOrderAndCancel(t *testing.T) {
	s, rec := newTestScheduler(chunkedProfile(100))
	s.submit(newJob(1, 30, 1, true, false), t0) // starts at once, alone: 10 + 30 ms
	s.submit(newJob(2, 40, 1, true, false), t0)
	s.submit(newJob(3, 20, 1, true, false), t0)
	runTo(s, t0)
	if len(rec.steps) != 2 || rec.steps[1].promptTokens != 60 || rec.steps[1].end != ms(40+10+40+10+20) {
		t.Fatalf("two short prompts behind a first: steps %+v, want a second of 60 tokens ending at 120 ms (two bases)", rec.steps)
	}

	s, _ = newTestScheduler(chunkedProfile(20))
	long, next := newJob(1, 100, 5, true, false), newJob(2, 10, 5, true, false)
	s.submit(long, t0)
	s.submit(next, t0)
	if long.state != jobPrefilling || next.state != jobQueued {
		t.Fatalf("long %v, next %v: the long prompt takes the budget", long.state, next.state)
	}
	remote := newJob(3, 50, 5, true, true)
	s.submit(remote, t0)
	if next.state != jobQueued || remote.state != jobQueued {
		t.Fatalf("remote %v: nothing overtakes the prompt waiting its turn", remote.state)
	}
	s.cancel(long, ms(1))
	if s.prefilling != nil || s.reserved != 0 || s.snapshot().running != 0 {
		t.Fatalf("cancelled while chunked: prefilling %v reserved %d", s.prefilling, s.reserved)
	}
	runTo(s, ms(1))
	if next.state != jobFinished || remote.state != jobFinished || s.reserved != 0 {
		t.Fatalf("next %v, remote %v, reserved %d: want both finished, nothing held", next.state, remote.state, s.reserved)
	}

	// A budget the batch fills: the prompt waits for room.
	s, rec = newTestScheduler(chunkedProfile(2))
	r1, r2 := newJob(1, 10, 3, true, true), newJob(2, 10, 3, true, true)
	s.submit(r1, t0)
	s.submit(r2, t0)
	p := newJob(3, 10, 1, true, false)
	s.submit(p, t0)
	runTo(s, t0)
	for i, st := range rec.steps {
		if st.kind == stepHybrid && st.streams >= 2 {
			t.Fatalf("step %d carried a chunk beside %d streams at a budget of 2", i, st.streams)
		}
	}
	if p.state != jobFinished {
		t.Fatalf("the prompt %v after the batch left", p.state)
	}
}
