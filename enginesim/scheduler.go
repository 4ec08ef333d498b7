package enginesim

import (
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/narwhal-llm/narwhal/config"
)

// jobState is where a request is in the engine. The terminal states come last.
type jobState uint32

const (
	jobQueued     jobState = iota // waiting for admission into the batch
	jobPrefilling                 // its prompt is being prefilled (the current step)
	jobDecoding                   // resident in the decode batch
	jobFinished                   // all output tokens generated
	jobCancelled                  // the client went away
	jobFailed                     // the engine closed under it
)

func (s jobState) terminal() bool { return s >= jobFinished }

// job is one request inside the engine. The first block is fixed at creation; the second is
// owned by the scheduler (guarded by the loop's mutex); the third is how the scheduler
// publishes progress to the handler goroutine without locks.
type job struct {
	id        uint64
	prompt    int      // prompt tokens
	output    int      // output tokens to generate
	explicit  bool     // output came from max_tokens/max_completion_tokens (finish "length"), not the draw ("stop")
	prefilled bool     // KV came from a remote prefiller: join the batch without a local prefill
	prefix    []uint64 // chained hashes of the prompt's prefix blocks (the virtual-time Model's prefix cache)
	// A chunked prefill (scheduler.budget): the prompt tokens to compute (past the prefix cache's
	// hit), those computed so far, those of the step in progress, and the job's prefill noise
	// factor.
	need, computed, chunk int
	factor                float64

	state     jobState
	generated int
	arrival   time.Time
	batchIdx  int
	// The lazy batch's bookkeeping (scheduler.lazy): the decode step count when it joined, its
	// tokens then, and the step count at which it has all its output.
	joinStep, finishAt uint64
	genAtJoin          int
	// Sequence numbers of the steps that produced the first, second and last token (tracing).
	firstStep, secondStep, lastStep uint64

	status   atomic.Uint32 // jobState; stored after progress, so a terminal status implies final progress
	progress atomic.Int64  // tokens generated so far
	notify   chan struct{} // capacity 1; signalled after every change of progress or status
}

func newJob(id uint64, prompt, output int, explicit, prefilled bool) *job {
	return &job{
		id: id, prompt: prompt, output: output, explicit: explicit, prefilled: prefilled,
		notify: make(chan struct{}, 1),
	}
}

// finishReason is the OpenAI finish_reason of a finished job.
func (j *job) finishReason() string {
	if j.explicit {
		return "length"
	}
	return "stop"
}

// publish hands the job's progress and state to its handler. It never blocks. A job of the
// virtual-time Model has no handler (and no notify channel): nothing to publish.
func (j *job) publish() {
	if j.notify == nil {
		return
	}
	j.progress.Store(int64(j.generated))
	j.status.Store(uint32(j.state))
	select {
	case j.notify <- struct{}{}:
	default:
	}
}

// observe returns the published state and progress, in the order that makes a terminal
// state imply final progress.
func (j *job) observe() (jobState, int) {
	st := jobState(j.status.Load())
	return st, int(j.progress.Load())
}

// stepKind is what the engine's (single) device is doing.
type stepKind uint8

const (
	stepIdle stepKind = iota
	stepPrefill
	stepDecode
	stepHybrid // a decode step (possibly of no stream) with a chunk of a prompt beside it
)

// stepRecord describes one step, for tests and benchmarks.
type stepRecord struct {
	seq          uint64
	kind         stepKind
	start, end   time.Time
	streams      int    // decode: resident streams at the step's start
	kvTokens     int    // decode: resident KV tokens at the step's start
	promptTokens int    // prefill: the prompt's tokens; hybrid: the chunk's
	jobID        uint64 // prefill, hybrid: the job prefilled (FIFO order)
}

// jobRecord describes one request that left the engine, for tests and benchmarks.
type jobRecord struct {
	id                              uint64
	state                           jobState
	arrival                         time.Time
	prompt, output, generated       int
	firstStep, secondStep, lastStep uint64
}

// jobEvents hears first tokens and ends with their times (the virtual-time Model); the HTTP
// engine's handlers watch published progress instead.
type jobEvents interface {
	firstToken(j *job, at time.Time)
	ended(j *job, st jobState, at time.Time)
}

// tracer observes the scheduler. It is called with the loop's mutex held, so it must be quick
// and must not call back into the engine.
type tracer interface {
	step(stepRecord)
	done(jobRecord)
}

// counts are the scheduler's cumulative counters, read by the metrics collector.
type counts struct {
	promptTokens     uint64 // prompt tokens prefilled locally
	generationTokens uint64
	successLength    uint64 // finished at max_tokens
	successStop      uint64 // finished at the drawn output length
	cancelled        uint64
}

// snapshot is the scheduler's load at one instant.
type snapshot struct {
	running  int // prefilling or decoding
	waiting  int // queued
	kvTokens int // resident KV tokens
	maxKV    int
	counts   counts
}

// scheduler is the engine's timing core: a deterministic state machine with no goroutines,
// no clock and no I/O. Time comes in as arguments; advance returns when it next needs to be
// called. It models vLLM: a FIFO queue; admission limited by max_streams and max_kv_tokens (a
// request reserves prompt+output tokens when admitted, so nothing is ever preempted);
// continuous batching of decode steps; prompts prefilled one at a time, either
//   - unchunked (no budget): each prompt in one step that gives its first token, before the
//     decode batch's next step (the batch waits);
//   - chunked (budget, profiles.X.chunked_prefill), as vLLM V1: every step carries the batch's
//     tokens first, then chunks of the prompts being prefilled, in FIFO order, in what is left
//     of the budget (a prompt is admitted while the budget has room past those before it), each
//     chunk adding its share of the prefill curve to the step (so the residents' TPOT grows
//     while prompts are chunked in); a prompt's last chunk gives its first token. A request
//     whose KV was prefilled elsewhere joins the batch when its turn comes.
type scheduler struct {
	prefill    *config.PrefillCurve
	decode     *config.DecodeCurve
	maxStreams int    // 0: unlimited
	maxKV      int    // 0: unlimited
	budget     int    // tokens a step carries (chunked prefill); 0: unchunked
	chunking   []*job // chunked: the prompts being prefilled, in admission order
	sigma      float64
	// The prefill noise of a job is drawn from a source seeded by (noiseSeed, the job's id):
	// the same job gets the same factor on whichever engine of the same seed prefills it, so
	// that replays of one workload under different policies share their random numbers.
	noiseSeed uint64
	noiseSrc  *rand.PCG
	noise     *rand.Rand
	trace     tracer
	events    jobEvents // nil in the HTTP engine
	// lazy keeps the decode batch without touching every resident at every step (the
	// virtual-time Model: no handler watches each token). A resident's progress is the steps
	// since it joined; a step touches only the streams that start or finish in it. The
	// schedule — every step's kind, batch, KV and length — is the eager one's.
	lazy      bool
	steps     uint64       // decode steps completed (lazy)
	finishing []*job       // lazy: the batch as a min-heap by finishAt
	fresh     []*job       // lazy: residents that have not decoded yet (their next step gives their first token)
	cache     *prefixCache // nil: no prefix cache (the HTTP engine)

	queue      []*job // FIFO of jobs not yet admitted
	prefilling *job   // the job of the current prefill step; nil if none or cancelled
	batch      []*job // decoding residents
	batchKV    int    // Σ prompt+generated over batch
	reserved   int    // Σ prompt+output over admitted jobs

	step    stepKind
	stepSeq uint64
	stepEnd time.Time
	stepRec stepRecord

	counts counts
}

func newScheduler(p config.Profile, sigma float64, seed int64) *scheduler {
	s := &scheduler{
		prefill:   p.Prefill,
		decode:    p.Decode,
		sigma:     sigma,
		noiseSeed: uint64(seed),
		noiseSrc:  rand.NewPCG(0, 0),
	}
	s.noise = rand.New(s.noiseSrc)
	if p.Decode != nil {
		s.maxStreams, s.maxKV = p.Decode.MaxStreams, p.Decode.MaxKVTokens
	}
	s.budget = p.ChunkedPrefill.BudgetTokens
	return s
}

// clone returns an independent copy of a virtual-time scheduler (no tracer, no handlers): its
// jobs, queue, batch and prefix cache copied, each job once wherever it is held.
func (s *scheduler) clone(events jobEvents) *scheduler {
	c := *s
	c.events = events
	c.noiseSrc = rand.NewPCG(0, 0)
	c.noise = rand.New(c.noiseSrc)
	jobs := make(map[*job]*job, len(s.queue)+len(s.batch)+1)
	cp := func(j *job) *job {
		if j == nil {
			return nil
		}
		if n, ok := jobs[j]; ok {
			return n
		}
		n := &job{id: j.id, prompt: j.prompt, output: j.output, explicit: j.explicit, prefilled: j.prefilled, prefix: j.prefix,
			need: j.need, computed: j.computed, factor: j.factor, state: j.state, generated: j.generated, arrival: j.arrival, batchIdx: j.batchIdx,
			joinStep: j.joinStep, finishAt: j.finishAt, genAtJoin: j.genAtJoin,
			firstStep: j.firstStep, secondStep: j.secondStep, lastStep: j.lastStep}
		jobs[j] = n
		return n
	}
	each := func(js []*job) []*job {
		out := make([]*job, len(js), cap(js))
		for i, j := range js {
			out[i] = cp(j)
		}
		return out
	}
	c.queue, c.batch, c.finishing, c.fresh = each(s.queue), each(s.batch), each(s.finishing), each(s.fresh)
	c.prefilling = cp(s.prefilling)
	c.chunking = each(s.chunking)
	c.cache = s.cache.clone()
	return &c
}

// submit queues j, arrived at now, and advances the schedule to now.
func (s *scheduler) submit(j *job, now time.Time) (next time.Time, busy bool) {
	j.arrival = now
	j.state = jobQueued
	s.queue = append(s.queue, j)
	return s.advance(now)
}

// cancel removes j wherever it is and frees what it held; a job already gone is left alone.
func (s *scheduler) cancel(j *job, now time.Time) (next time.Time, busy bool) {
	switch j.state {
	case jobQueued:
		for i, q := range s.queue {
			if q == j {
				copy(s.queue[i:], s.queue[i+1:])
				s.queue[len(s.queue)-1] = nil
				s.queue = s.queue[:len(s.queue)-1]
				s.end(j, jobCancelled)
				break
			}
		}
	case jobPrefilling:
		// The device finishes the step it started; the request no longer holds anything.
		if s.prefilling == j {
			s.prefilling = nil
		}
		s.chunking = deleteJob(s.chunking, j)
		s.reserved -= j.prompt + j.output
		s.end(j, jobCancelled)
	case jobDecoding:
		s.leaveBatch(j)
		s.end(j, jobCancelled)
	}
	return s.advance(now)
}

// failAll ends every job the engine holds with jobFailed (the engine is closing).
func (s *scheduler) failAll() {
	for _, j := range s.queue {
		s.end(j, jobFailed)
	}
	clear(s.queue)
	s.queue = s.queue[:0]
	if j := s.prefilling; j != nil {
		s.prefilling = nil
		s.end(j, jobFailed)
	}
	for _, j := range s.chunking {
		s.end(j, jobFailed)
	}
	clear(s.chunking)
	s.chunking = s.chunking[:0]
	for _, j := range s.batch {
		s.end(j, jobFailed)
	}
	clear(s.batch)
	s.batch = s.batch[:0]
	clear(s.finishing)
	clear(s.fresh)
	s.finishing, s.fresh = s.finishing[:0], s.fresh[:0]
	s.batchKV, s.reserved = 0, 0
	s.step = stepIdle
}

// advance completes every step that ends at or before now, starts the steps that follow, and
// returns the end of the step in progress (busy) or busy=false when the engine is idle.
//
// Steps are chained on absolute deadlines: the next step starts where the previous one ended,
// not when advance happened to run, so lateness of the caller does not accumulate. If the
// caller is late by more than a whole step, the next step is placed to end now rather than in
// the past, so a late engine catches up one step at a time instead of emitting a burst.
func (s *scheduler) advance(now time.Time) (next time.Time, busy bool) {
	if s.step == stepIdle && !s.begin(now, now) {
		return time.Time{}, false
	}
	for !s.stepEnd.After(now) {
		end := s.stepEnd
		s.completeStep()
		if !s.begin(end, now) {
			return time.Time{}, false
		}
	}
	return s.stepEnd, true
}

// begin chooses and starts the next step after prevEnd. It returns false when there is
// nothing to do.
func (s *scheduler) begin(prevEnd, now time.Time) bool {
	if s.budget > 0 {
		return s.beginChunked(prevEnd, now)
	}
	for len(s.queue) > 0 {
		if !s.fits(s.queue[0]) {
			break // strict FIFO: nothing overtakes a head that does not fit
		}
		h, prompt := s.admit()
		if !prompt {
			continue
		}
		s.prefilling = h
		secs := s.prefill.Seconds(h.prompt-s.cache.hit(h.prefix, h.prompt)) * s.noiseFactor(h.id)
		s.startStep(stepPrefill, prevEnd, now, secs)
		s.stepRec.promptTokens, s.stepRec.jobID = h.prompt, h.id
		return true
	}
	return s.beginDecode(prevEnd, now)
}

// beginDecode starts a decode step of the batch, or idles.
func (s *scheduler) beginDecode(prevEnd, now time.Time) bool {
	if len(s.batch) > 0 {
		s.startStep(stepDecode, prevEnd, now, s.decode.StepSeconds(len(s.batch), s.batchKV))
		s.stepRec.streams, s.stepRec.kvTokens = len(s.batch), s.batchKV
		return true
	}
	s.step = stepIdle
	return false
}

// beginChunked chooses and starts the next step of a chunked engine: prompts are admitted
// (FIFO) while the budget has room past the batch and the prompts before them, requests
// prefilled elsewhere join the batch in their turn, and the step carries the batch's tokens and
// the prompts' chunks in what is left of the budget, in admission order.
func (s *scheduler) beginChunked(prevEnd, now time.Time) bool {
	left := s.budget - len(s.batch)
	for _, j := range s.chunking {
		left -= j.need - j.computed
	}
	for len(s.queue) > 0 {
		if h := s.queue[0]; !h.prefilled && left <= 0 || !s.fits(h) {
			break // strict FIFO: nothing overtakes a head that has no room
		}
		h, prompt := s.admit()
		if !prompt {
			left--
			continue
		}
		// The last prompt token is computed, whatever the prefix cache holds.
		h.need, h.computed, h.factor = max(h.prompt-s.cache.hit(h.prefix, h.prompt), 1), 0, s.noiseFactor(h.id)
		s.chunking = append(s.chunking, h)
		left -= h.need
	}
	left = s.budget - len(s.batch)
	secs, tokens := 0.0, 0
	for _, j := range s.chunking {
		j.chunk = min(j.need-j.computed, max(left, 0))
		if j.chunk == 0 {
			continue
		}
		left -= j.chunk
		tokens += j.chunk
		// The chunk's share of the prefill curve: tokens [computed, computed+chunk) of
		// BaseS + a·N + b·N², the base with the first chunk. Alone, a prompt takes what the
		// curve says, chunked or not (the curve is what a prompt alone on the engine measures).
		c, k, p := float64(j.computed), float64(j.chunk), s.prefill
		secs += (p.PerTokenS*k + p.PerToken2S*((c+k)*(c+k)-c*c)) * j.factor
		if j.computed == 0 {
			secs += p.BaseS * j.factor
		}
	}
	if tokens == 0 {
		return s.beginDecode(prevEnd, now)
	}
	if len(s.batch) > 0 {
		secs += s.decode.StepSeconds(len(s.batch), s.batchKV)
	}
	s.startStep(stepHybrid, prevEnd, now, secs)
	s.stepRec.streams, s.stepRec.kvTokens = len(s.batch), s.batchKV
	s.stepRec.promptTokens, s.stepRec.jobID = tokens, s.chunking[0].id
	return true
}

// admit takes the queue's head into the engine and reserves its tokens: a request prefilled
// elsewhere joins the batch (prompt false), a prompt is the caller's to prefill.
func (s *scheduler) admit() (h *job, prompt bool) {
	h = s.queue[0]
	s.queue[0] = nil
	s.queue = s.queue[1:]
	s.reserved += h.prompt + h.output
	if h.prefilled {
		s.joinBatch(h)
		h.publish()
		return h, false
	}
	h.state = jobPrefilling
	h.publish()
	return h, true
}

// noiseFactor is job id's prefill noise: exp(σ·z), z drawn from the source seeded by (the
// engine's seed, id); 1 without noise.
func (s *scheduler) noiseFactor(id uint64) float64 {
	if s.sigma <= 0 {
		return 1
	}
	s.noiseSrc.Seed(s.noiseSeed^0x6e6f697365, id) // "noise"
	return math.Exp(s.sigma * s.noise.NormFloat64())
}

// deleteJob removes j from js, keeping the order.
func deleteJob(js []*job, j *job) []*job {
	for i, x := range js {
		if x == j {
			copy(js[i:], js[i+1:])
			js[len(js)-1] = nil
			return js[:len(js)-1]
		}
	}
	return js
}

// fits reports whether admitting j keeps the engine within max_streams and max_kv_tokens.
func (s *scheduler) fits(j *job) bool {
	streams := len(s.batch) + len(s.chunking)
	if s.prefilling != nil {
		streams++
	}
	if s.maxStreams > 0 && streams >= s.maxStreams {
		return false
	}
	return s.maxKV <= 0 || s.reserved+j.prompt+j.output <= s.maxKV
}

// startStep starts a step of secs seconds chained onto prevEnd, but starting no earlier than
// one step before now.
func (s *scheduler) startStep(kind stepKind, prevEnd, now time.Time, secs float64) {
	dur := time.Duration(secs * float64(time.Second))
	start := prevEnd
	if earliest := now.Add(-dur); start.Before(earliest) {
		start = earliest
	}
	s.stepSeq++
	s.step = kind
	s.stepEnd = start.Add(dur)
	s.stepRec = stepRecord{seq: s.stepSeq, kind: kind, start: start, end: s.stepEnd}
}

// completeStep applies the effects of the step in progress at its end.
func (s *scheduler) completeStep() {
	seq := s.stepSeq
	if s.trace != nil {
		s.trace.step(s.stepRec)
	}
	switch s.step {
	case stepPrefill:
		if j := s.prefilling; j != nil { // nil: cancelled during its prefill
			s.prefilling = nil
			s.firstToken(j, seq)
		}
	case stepDecode:
		s.decodeStep(seq)
	case stepHybrid:
		if len(s.batch) > 0 {
			s.decodeStep(seq)
		}
		// A prompt cancelled during its chunk has left s.chunking already.
		keep := s.chunking[:0]
		var done []*job
		for _, j := range s.chunking {
			if j.computed, j.chunk = j.computed+j.chunk, 0; j.computed >= j.need {
				done = append(done, j)
				continue
			}
			keep = append(keep, j)
		}
		clear(s.chunking[len(keep):])
		s.chunking = keep
		for _, j := range done {
			s.firstToken(j, seq)
		}
	}
	s.step = stepIdle
}

// firstToken ends j's prefill in step seq: its first token, then the decode batch (or its end,
// when it wanted one token).
func (s *scheduler) firstToken(j *job, seq uint64) {
	s.counts.promptTokens += uint64(j.prompt)
	s.counts.generationTokens++
	j.generated = 1
	j.firstStep, j.lastStep = seq, seq
	if s.events != nil {
		s.events.firstToken(j, s.stepEnd)
	}
	if j.generated >= j.output {
		s.reserved -= j.prompt + j.output
		s.end(j, jobFinished)
		return
	}
	s.joinBatch(j)
	j.publish()
}

// decodeStep gives every resident of the batch one more token in step seq; those done leave.
func (s *scheduler) decodeStep(seq uint64) {
	s.counts.generationTokens += uint64(len(s.batch))
	if s.lazy {
		s.lazyStep()
		return
	}
	keep := s.batch[:0]
	for _, j := range s.batch {
		j.generated++
		s.batchKV++
		switch j.generated {
		case 1:
			j.firstStep = seq
			if s.events != nil {
				s.events.firstToken(j, s.stepEnd)
			}
		case 2:
			j.secondStep = seq
		}
		j.lastStep = seq
		if j.generated >= j.output {
			s.batchKV -= j.prompt + j.generated
			s.reserved -= j.prompt + j.output
			s.end(j, jobFinished)
			continue
		}
		j.batchIdx = len(keep)
		keep = append(keep, j)
		j.publish()
	}
	clear(s.batch[len(keep):])
	s.batch = keep
}

// joinBatch makes j a decoding resident. The caller publishes.
func (s *scheduler) joinBatch(j *job) {
	j.state = jobDecoding
	j.batchIdx = len(s.batch)
	s.batch = append(s.batch, j)
	s.batchKV += j.prompt + j.generated
	if s.lazy {
		j.joinStep, j.genAtJoin = s.steps, j.generated
		j.finishAt = s.steps + uint64(j.output-j.generated)
		s.pushFinishing(j)
		if j.generated == 0 {
			s.fresh = append(s.fresh, j)
		}
	}
}

// lazyStep is a decode step of the lazy batch: every resident has one more token (its KV
// grows by one), those that had none give their first token, and those whose output is done
// leave, in the order they finish.
func (s *scheduler) lazyStep() {
	s.steps++
	s.batchKV += len(s.batch)
	for _, j := range s.fresh {
		if j.state == jobDecoding && s.events != nil {
			s.events.firstToken(j, s.stepEnd)
		}
	}
	clear(s.fresh)
	s.fresh = s.fresh[:0]
	for len(s.finishing) > 0 && s.finishing[0].finishAt <= s.steps {
		j := s.popFinishing()
		if j.state != jobDecoding {
			continue // cancelled
		}
		s.leaveBatch(j)
		s.end(j, jobFinished)
	}
}

// pushFinishing and popFinishing keep the lazy batch's heap by finishAt, then id.
func (s *scheduler) pushFinishing(j *job) {
	h := append(s.finishing, j)
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !finishesBefore(h[i], h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	s.finishing = h
}

func (s *scheduler) popFinishing() *job {
	h := s.finishing
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h[n] = nil
	h = h[:n]
	for i := 0; ; {
		l, m := 2*i+1, i
		if l < n && finishesBefore(h[l], h[m]) {
			m = l
		}
		if r := l + 1; r < n && finishesBefore(h[r], h[m]) {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	s.finishing = h
	return top
}

func finishesBefore(a, b *job) bool {
	if a.finishAt != b.finishAt {
		return a.finishAt < b.finishAt
	}
	return a.id < b.id
}

// leaveBatch removes a decoding resident and frees its KV.
func (s *scheduler) leaveBatch(j *job) {
	if s.lazy {
		j.generated = min(j.output, j.genAtJoin+int(s.steps-j.joinStep))
	}
	last := len(s.batch) - 1
	moved := s.batch[last]
	s.batch[j.batchIdx] = moved
	moved.batchIdx = j.batchIdx
	s.batch[last] = nil
	s.batch = s.batch[:last]
	s.batchKV -= j.prompt + j.generated
	s.reserved -= j.prompt + j.output
}

// end moves j to a terminal state, counts it, traces it and tells its handler.
func (s *scheduler) end(j *job, st jobState) {
	j.state = st
	switch {
	case st == jobFinished && j.explicit:
		s.counts.successLength++
	case st == jobFinished:
		s.counts.successStop++
	case st == jobCancelled:
		s.counts.cancelled++
	}
	if s.trace != nil {
		s.trace.done(jobRecord{
			id: j.id, state: st, arrival: j.arrival,
			prompt: j.prompt, output: j.output, generated: j.generated,
			firstStep: j.firstStep, secondStep: j.secondStep, lastStep: j.lastStep,
		})
	}
	if s.events != nil {
		s.events.ended(j, st, s.stepEnd)
	}
	j.publish()
}

// snapshot reports the scheduler's current load and counters.
func (s *scheduler) snapshot() snapshot {
	sn := snapshot{running: len(s.batch), waiting: len(s.queue), kvTokens: s.batchKV, maxKV: s.maxKV, counts: s.counts}
	if s.prefilling != nil {
		sn.running++
		sn.kvTokens += s.prefilling.prompt
	}
	for _, j := range s.chunking {
		sn.running++
		sn.kvTokens += j.prompt
	}
	return sn
}
