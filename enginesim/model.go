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

// NewModel returns an idle engine timed by p, with the prefill noise of sigma seeded by seed.
func NewModel(p config.Profile, sigma float64, seed int64, obs Observer) *Model {
	m := &Model{s: newScheduler(p, sigma, seed), obs: obs}
	m.s.events = m
	return m
}

// Submit queues a request of prompt tokens that will generate output tokens (≥ 1), arrived at
// now; prefilled says its KV came from another engine (no local prefill). It returns when the
// model next needs Advance (busy false: idle).
func (m *Model) Submit(now time.Time, id uint64, prompt, output int, prefilled bool) (next time.Time, busy bool) {
	j := &job{id: id, prompt: prompt, output: max(output, 1), prefilled: prefilled}
	return m.s.submit(j, now)
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
	obs := m.obs
	m.obs = nil
	m.s.failAll()
	m.obs = obs
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
