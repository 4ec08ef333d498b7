package enginesim

import (
	"time"

	"github.com/narwhal-llm/narwhal/config"
)

// Model is one simulated engine driven in virtual time: the scheduler the HTTP engine runs,
// with no goroutine, clock or I/O around it, for `narwhal sim`. The caller names each request
// by an id of its own, tells the model the time at every call, calls Advance at the times it
// returns, and hears of first tokens and ends through its Observer.
type Model struct {
	s   *scheduler
	obs Observer
}

// Observer hears what a Model's requests do, at the step end that does it. It is called from
// inside Submit and Advance, and must not call back into the model.
type Observer interface {
	// FirstToken: the request's first output token (its local prefill ended, or, for a
	// request prefilled elsewhere, its first decode step).
	FirstToken(id uint64, at time.Time)
	// Finished: the request generated all its output tokens.
	Finished(id uint64, at time.Time, generated int)
}

// ModelOptions configure a Model.
type ModelOptions struct {
	NoiseSigma float64 // the log-normal noise on prefill times (0: exact)
	Seed       int64
	// PrefixBlocks is the prefix cache's size in blocks of BlockTokens tokens (0: no cache):
	// a prompt whose leading blocks are cached prefills only the rest.
	PrefixBlocks, BlockTokens int
}

// NewModel returns an idle engine timed by p.
func NewModel(p config.Profile, o ModelOptions, obs Observer) *Model {
	m := &Model{s: newScheduler(p, o.NoiseSigma, o.Seed), obs: obs}
	m.s.events, m.s.lazy = m, true
	m.s.cache = newPrefixCache(o.PrefixBlocks, o.BlockTokens)
	return m
}

// Job is a request as a Model takes it.
type Job struct {
	ID     uint64 // the caller's
	Prompt int    // prompt tokens
	Output int    // output tokens to generate (at least 1)
	// Prefilled says its KV came from another engine: no local prefill.
	Prefilled bool
	// Prefix holds the chained hashes of its prompt's prefix blocks, for the prefix cache.
	Prefix []uint64
}

// Submit queues j, arrived at now. It returns when the model next needs Advance (busy false:
// idle).
func (m *Model) Submit(now time.Time, j Job) (next time.Time, busy bool) {
	return m.s.submit(&job{id: j.ID, prompt: j.Prompt, output: max(j.Output, 1), prefilled: j.Prefilled, prefix: j.Prefix}, now)
}

// PrefixHits is what the prefix cache served: prompt tokens from the cache, of all prompt
// tokens prefilled here.
func (m *Model) PrefixHits() (cached, prompt uint64) {
	if c := m.s.cache; c != nil {
		return c.hitTokens, c.promptTokens
	}
	return 0, 0
}

// Clone returns an independent copy of the model, in the same state, that reports to obs (the
// simulator forks a replay with it). The copy and the original then run apart.
func (m *Model) Clone(obs Observer) *Model {
	n := &Model{obs: obs}
	n.s = m.s.clone(n)
	return n
}

// Advance completes the steps that end at or before now and starts the next ones.
func (m *Model) Advance(now time.Time) (next time.Time, busy bool) { return m.s.advance(now) }

// Fail ends every request the engine holds (it went down) and returns their ids, in queue,
// prefill and batch order; the observer hears nothing of them.
func (m *Model) Fail() []uint64 {
	var ids []uint64
	for _, j := range m.s.queue {
		ids = append(ids, j.id)
	}
	if j := m.s.prefilling; j != nil {
		ids = append(ids, j.id)
	}
	for _, j := range m.s.batch {
		ids = append(ids, j.id)
	}
	m.s.failAll() // ended hears only finished requests
	return ids
}

// Residents is how many requests the engine holds: queued, prefilling and decoding.
func (m *Model) Residents() int {
	n := len(m.s.queue) + len(m.s.batch)
	if m.s.prefilling != nil {
		n++
	}
	return n
}

// Decoding is the decode batch now: its streams and their KV tokens.
func (m *Model) Decoding() (streams, kvTokens int) { return len(m.s.batch), m.s.batchKV }

func (m *Model) firstToken(j *job, at time.Time) { m.obs.FirstToken(j.id, at) }

func (m *Model) ended(j *job, st jobState, at time.Time) {
	if st == jobFinished && m.obs != nil {
		m.obs.Finished(j.id, at, j.generated)
	}
}
