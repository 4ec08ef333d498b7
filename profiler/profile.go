// Package profiler measures a live OpenAI-compatible engine (vLLM, SGLang, enginesim) and fits
// the profile Narwhal prices work with (docs/profiling.md): the prefill curve from the time to
// first token of prompts alone at a ladder of lengths, the decode curve from batches of
// concurrent streams at several context lengths, the stream and KV limits from where the engine
// starts queueing, and the KV handoff time through a prefiller. Prompts are sized by the
// engine's own usage.prompt_tokens. The run keeps what it measured when it is cut short (the
// budget, an engine that fails mid-sweep) and says so.
package profiler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/engineclient"
	"github.com/narwhal-llm/narwhal/wire"
)

// Options says what to measure and within what time.
type Options struct {
	Engine *Engine
	// Prefiller, when set, is an engine the measured one pulls KV from (the handoff header,
	// as placement sends it): kv_transfer_s is measured through it.
	Prefiller *Engine
	// MaxPromptTokens tops the prefill ladder; 0 takes the engine's max_model_len (GET
	// /v1/models), or 32,768 when it says none.
	MaxPromptTokens int
	// Budget bounds the whole run (default 5 minutes): prefill to 20% of it, decode to 60%,
	// the limits to 95%, the handoff the rest; time a phase leaves goes to the next.
	Budget time.Duration
	// Repeats is the number of prefills at each ladder length (default 3).
	Repeats int
	// DecodeTokens is the output of each decode stream (default 48).
	DecodeTokens int
	// MaxBatch is the largest decode batch of the fit (default 64); MaxStreamsProbe the largest
	// batch the stream-limit probe sends (default 1,024).
	MaxBatch, MaxStreamsProbe int
	// Progress, when set, hears of every step.
	Progress func(Progress)
}

// Progress is where a run is.
type Progress struct {
	Phase           string // "prefill", "decode", "limits", "handoff"
	Done, Total     int    // steps of the phase
	Elapsed, Budget time.Duration
	Detail          string
}

// PrefillPoint is one prompt's time to first token, alone on the engine.
type PrefillPoint struct {
	PromptTokens int
	TTFTS        float64
}

// DecodePoint is one batch's decode step: Streams concurrent streams with KVTokens resident
// (prompts plus tokens generated, at the middle of the measured window).
type DecodePoint struct {
	Streams, PromptTokens, KVTokens int
	StepS                           float64
}

// Limit is a measured engine limit.
type Limit struct {
	Value   int
	Reached bool   // the engine was seen queueing at Value (else Value is a lower bound)
	How     string // how it was found
}

// Result is what a run measured and fitted.
type Result struct {
	URL, Model  string
	MaxModelLen int // what GET /v1/models said, 0 when nothing
	HasMetrics  bool
	PromptTop   int // the ladder's top (the context limit or --max-prompt-tokens)
	// RTT is the fastest round trip of GET /v1/models, taken off every time to first token:
	// the profile describes the engine, not the network to it.
	RTT time.Duration

	Prefill    []PrefillPoint // every measurement
	PrefillFit *Fit           // over the per-length medians: base_s, per_token_s, per_token2_s
	Decode     []DecodePoint
	DecodeFit  *Fit // base_s, per_stream_s, per_kv_token_s
	MaxStreams Limit
	MaxKV      Limit
	KVTransfer []float64 // one estimate per handoff measured
	// Together is the prefill of TogetherPrompts prompts of TogetherTokens sent at once: the last
	// first token's time over the fitted time of that many one after another (1: the engine
	// prefills one prompt at a time, as Narwhal's projection runs them; lower: it prefills them
	// together). 0 when not measured.
	Together                        float64
	TogetherPrompts, TogetherTokens int
	// ChunkBudget is the engine's per-step token budget as a prompt prefilled beside a decode
	// batch showed it (profiles.X.chunked_prefill.budget_tokens; 0: the batch waited the whole
	// prefill, unchunked, or it fit one step); ChunkSteps the residents' steps the prompt
	// widened; ChunkMeasured whether it was measured.
	ChunkBudget, ChunkSteps int
	ChunkMeasured           bool
	Notes                   []string // what stopped where, and why
	// Err is what cut the run short (the results so far are kept); nil when it ran through.
	Err     error
	Elapsed time.Duration
}

// Run profiles o.Engine. It returns an error without a result only when nothing could be
// measured (an unreachable URL, a server that is not OpenAI-compatible, a model it does not
// serve); after that, failures end the run early with Result.Err set and what was measured kept.
func Run(ctx context.Context, o Options) (*Result, error) {
	o.defaults()
	begin := time.Now()
	r := &Result{URL: o.Engine.URL, Model: o.Engine.Model}
	served, err := o.Engine.Models(ctx)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(served.Models, o.Engine.Model) {
		return nil, fmt.Errorf("%s does not serve model %q (it serves %s)", o.Engine.URL, o.Engine.Model, strings.Join(served.Models, ", "))
	}
	r.MaxModelLen = served.MaxModelLen
	m, merr := o.Engine.Metrics(ctx)
	r.HasMetrics = merr == nil
	probe, err := NewProbe(ctx, o.Engine)
	if err != nil {
		return nil, err
	}
	r.RTT = probe.RTT
	p := &run{o: o, r: r, begin: begin, ctx: ctx, metrics0: m, probe: probe}
	switch {
	case o.MaxPromptTokens > 0:
		r.PromptTop = o.MaxPromptTokens
	case served.MaxModelLen > 0:
		r.PromptTop = served.MaxModelLen - 8
	default:
		r.PromptTop = 32768
		p.note("the engine says no context limit (max_model_len in GET /v1/models): the prefill ladder stops at %d tokens; pass --max-prompt-tokens to change it", r.PromptTop)
	}
	steps := []struct {
		share float64
		fn    func(deadline time.Time) error
	}{{0.20, p.prefill}, {0.22, p.together}, {0.60, p.decode}, {0.70, p.chunked}, {0.95, p.limits}, {1, p.handoff}}
	for _, s := range steps {
		if err := s.fn(begin.Add(time.Duration(s.share * float64(o.Budget)))); err != nil {
			r.Err = err
			break
		}
	}
	r.Elapsed = time.Since(begin)
	return r, nil
}

func (o *Options) defaults() {
	if o.Budget <= 0 {
		o.Budget = 5 * time.Minute
	}
	if o.Repeats <= 0 {
		o.Repeats = 3
	}
	if o.DecodeTokens <= 0 {
		o.DecodeTokens = 48
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 64
	}
	if o.MaxStreamsProbe <= 0 {
		o.MaxStreamsProbe = 1024
	}
}

// run is one profiling run's working state.
type run struct {
	o        Options
	r        *Result
	ctx      context.Context
	begin    time.Time
	probe    *Probe
	metrics0 engineclient.Metrics
	kvSeen   []float64 // KV capacity estimates from the decode batches' scrapes
	// kvRan is the most KV tokens a batch held (streams × (prompt + output)) that ran without
	// queueing: a KV cache the engine reports smaller than this does not bind it.
	kvRan int
}

func (p *run) note(format string, args ...any) {
	p.r.Notes = append(p.r.Notes, fmt.Sprintf(format, args...))
}

func (p *run) progress(phase string, done, total int, detail string) {
	if p.o.Progress != nil {
		p.o.Progress(Progress{Phase: phase, Done: done, Total: total, Elapsed: time.Since(p.begin), Budget: p.o.Budget, Detail: detail})
	}
}

// Probe times prompts of a wanted size on one engine: prompts sized by the engine's own token
// count, unique so that no prefix cache serves them, times to first token with the network's
// round trip taken off.
type Probe struct {
	Engine *Engine
	RTT    time.Duration // the fastest round trip of GET /v1/models
	sizer  sizer
	nonce  atomic.Int64
}

// NewProbe measures e's round trip and calibrates prompt sizes on it (two completions).
func NewProbe(ctx context.Context, e *Engine) (*Probe, error) {
	p := &Probe{Engine: e}
	var err error
	if p.RTT, err = roundTrip(ctx, e); err != nil {
		return nil, err
	}
	if p.sizer, err = calibrate(ctx, e); err != nil {
		return nil, err
	}
	return p, nil
}

// Prompt is a prompt of about n tokens (the engine's count), unique.
func (p *Probe) Prompt(n int) string { return p.sizer.prompt(n, int(p.nonce.Add(1))) }

// Prefill times one prompt of about n tokens alone (max_tokens 1).
func (p *Probe) Prefill(ctx context.Context, n int) (PrefillPoint, error) {
	tr, err := p.Engine.Stream(ctx, Request{Prompt: p.Prompt(n), MaxTokens: 1})
	if err == nil && (len(tr.Tokens) == 0 || tr.PromptTokens == 0) {
		err = fmt.Errorf("POST /v1/completions: no token or no usage.prompt_tokens in the stream")
	}
	if err != nil {
		return PrefillPoint{}, err
	}
	return PrefillPoint{PromptTokens: tr.PromptTokens, TTFTS: (tr.TTFT() - p.RTT).Seconds()}, nil
}

// Decode times a batch of streams concurrent streams of prompt tokens and output tokens each:
// its decode step. An engine that queued some of them behind others gives no step (an error
// saying how many it ran at once).
func (p *Probe) Decode(ctx context.Context, streams, prompt, output int) (DecodePoint, error) {
	b := p.batch(ctx, streams, prompt, output, false)
	if b.err != nil {
		return DecodePoint{}, b.err
	}
	if n, _, ok := b.streamLimit(); ok {
		return DecodePoint{}, fmt.Errorf("the engine ran %d of %d streams at once", n, streams)
	}
	d, ok := b.step()
	if !ok {
		return DecodePoint{}, fmt.Errorf("the %d streams were never all decoding at once", streams)
	}
	return d, nil
}

// prefill measures the ladder, one prompt at a time, and fits the curve.
func (p *run) prefill(deadline time.Time) error {
	ladder := ladder(32, p.r.PromptTop)
	total := len(ladder) * p.o.Repeats
	var err error
ladder:
	for i, n := range ladder {
		for k := range p.o.Repeats {
			if time.Now().After(deadline) {
				switch {
				case k > 0:
					p.note("prefill: the budget ended the ladder at %d tokens, after %d of its %d repeats", n, k, p.o.Repeats)
				case i > 0:
					p.note("prefill: the budget ended the ladder after %d tokens (%d were next)", ladder[i-1], n)
				default:
					p.note("prefill: the budget ended the ladder before its first rung (%d tokens)", n)
				}
				break ladder
			}
			p.progress("prefill", i*p.o.Repeats+k, total, fmt.Sprintf("%d tokens", n))
			pt, e := p.probe.Prefill(p.ctx, n)
			if ContextExceeded(e) {
				p.note("prefill: the engine refused a %d-token prompt as over its context; the ladder ends there", n)
				break ladder
			}
			if e != nil {
				err = fmt.Errorf("prefill at %d tokens: %w", n, e)
				break ladder
			}
			p.r.Prefill = append(p.r.Prefill, pt)
		}
	}
	p.progress("prefill", total, total, "fitting")
	var x [][]float64
	var y []float64
	for _, pt := range p.r.medians() {
		t := float64(pt.PromptTokens)
		x, y = append(x, []float64{1, t, t * t}), append(y, pt.TTFTS)
	}
	if f, e := fitNonNegative(x, y); e == nil {
		p.r.PrefillFit = &f
	} else if err == nil {
		err = fmt.Errorf("prefill: %w (%d lengths measured)", e, len(y))
	}
	return err
}

// together sends prefill_concurrency prompts at once (the dispatch depth placement gives a
// prefill engine) and compares the last first token with the fitted time of as many one after
// another: Narwhal projects a prefill engine's dispatched prompts in FIFO order, and an engine
// that prefills them together runs ahead of that (the online correction then learns the
// difference; the profile says so).
func (p *run) together(deadline time.Time) error {
	k := config.DefaultProfile().PrefillConcurrency
	n := min(1024, p.r.PromptTop/2)
	serial := float64(k) * p.prefillSeconds(n)
	if p.r.PrefillFit == nil {
		return nil
	}
	if time.Until(deadline).Seconds() < 2*serial {
		p.note("prefill: the budget left no time to prefill %d prompts at once", k)
		return nil
	}
	p.progress("prefill", 1, 1, fmt.Sprintf("%d prompts at once", k))
	b := p.probe.batch(p.ctx, k, n, 1, false)
	if b.err != nil {
		return fmt.Errorf("prefill, %d prompts of %d tokens at once: %w", k, n, b.err)
	}
	last := time.Duration(0)
	for _, t := range b.traces {
		last = max(last, t.TTFT())
	}
	p.r.Together, p.r.TogetherPrompts, p.r.TogetherTokens = max(0, (last-p.probe.RTT).Seconds())/serial, k, n
	if p.r.Together < 0.85 {
		p.note("prefill: %d prompts of %d tokens sent at once all had their first tokens after %.2f of the time one after another takes: this engine prefills prompts together; Narwhal projects them one after another, and its online correction learns the difference (engines[].correction in /narwhal/state)",
			k, n, p.r.Together)
	}
	return nil
}

// ladder is 1.5× steps from lo up to top, top included.
func ladder(lo, top int) []int {
	var out []int
	for n := float64(lo); int(n) < top; n *= 1.5 {
		out = append(out, int(n))
	}
	return append(out, top)
}

// batch is one decode batch's streams and what the engine's metrics said while it ran.
type batch struct {
	traces  []Trace
	samples []sample
	err     error
}

type sample struct {
	at time.Time
	m  engineclient.Metrics
}

// batch sends n concurrent streams of prompt tokens and output tokens each, scraping the
// engine's metrics every 50 ms while they run when scrape is set.
func (p *Probe) batch(ctx context.Context, n, prompt, output int, scrape bool) batch {
	var b batch
	b.traces = make([]Trace, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	done := make(chan struct{})
	var samples []sample
	var sw sync.WaitGroup
	if scrape {
		sw.Go(func() {
			t := time.NewTicker(50 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-done:
					return
				case <-t.C:
					if m, err := p.Engine.Metrics(ctx); err == nil {
						samples = append(samples, sample{time.Now(), m})
					}
				}
			}
		})
	}
	for i := range n {
		wg.Go(func() {
			b.traces[i], errs[i] = p.Engine.Stream(ctx, Request{Prompt: p.Prompt(prompt), MaxTokens: output})
		})
	}
	wg.Wait()
	close(done)
	sw.Wait()
	b.samples = samples
	b.err = errors.Join(errs...)
	return b
}

// queued reports how many of a batch's streams had their first token before any stream
// ended: the streams the engine ran at once (all of them when nothing queued).
func (b *batch) concurrent() int {
	first := time.Time{}
	for _, t := range b.traces {
		if first.IsZero() || t.End.Before(first) {
			first = t.End
		}
	}
	n := 0
	for _, t := range b.traces {
		if len(t.Tokens) > 0 && t.Tokens[0].Before(first) {
			n++
		}
	}
	return n
}

// decode measures batches over streams × context lengths, cheapest first, and fits the step.
func (p *run) decode(deadline time.Time) error {
	top := p.r.PromptTop - p.o.DecodeTokens
	contexts := slices.Compact([]int{64, min(1024, top/4), min(4096, top/2)})
	type cell struct{ streams, prompt int }
	var cells []cell
	for b := 1; b <= p.o.MaxBatch; b *= 2 {
		for _, c := range contexts {
			if c > 0 {
				cells = append(cells, cell{b, c})
			}
		}
	}
	cost := func(c cell) float64 { return float64(c.streams) * p.prefillSeconds(c.prompt) }
	sort.SliceStable(cells, func(i, j int) bool { return cost(cells[i]) < cost(cells[j]) })
	var err error
	for i, c := range cells {
		if left := time.Until(deadline).Seconds(); left <= 0 || cost(c)+float64(p.o.DecodeTokens)*0.05 > left {
			p.note("decode: the budget left %d of %d batches unmeasured (the largest: %d streams of %d tokens)", len(cells)-i, len(cells), cells[len(cells)-1].streams, cells[len(cells)-1].prompt)
			break
		}
		p.progress("decode", i, len(cells), fmt.Sprintf("%d streams × %d tokens", c.streams, c.prompt))
		b := p.probe.batch(p.ctx, c.streams, c.prompt, p.o.DecodeTokens, p.r.HasMetrics)
		if b.err != nil {
			err = fmt.Errorf("decode, %d streams of %d tokens: %w", c.streams, c.prompt, b.err)
			break
		}
		if n, how, ok := b.streamLimit(); ok {
			// Not one batch, so no step time; the limit it shows is the streams' if the
			// prompts are short, else perhaps the KV's (the probes below tell).
			p.note("decode: %d streams of %d tokens queued: %d ran at once", c.streams, c.prompt, n)
			if c.prompt <= 64 && !p.r.MaxStreams.Reached {
				p.r.MaxStreams = Limit{Value: n, Reached: true, How: how}
			}
			p.kvFromSamples(&b)
			continue
		}
		if pt, ok := b.step(); ok {
			p.r.Decode = append(p.r.Decode, pt)
		}
		p.kvFromSamples(&b)
		p.kvRan = max(p.kvRan, c.streams*(c.prompt+p.o.DecodeTokens))
	}
	p.progress("decode", len(cells), len(cells), "fitting")
	var x [][]float64
	var y []float64
	for _, d := range p.r.Decode {
		x, y = append(x, []float64{1, float64(d.Streams), float64(d.KVTokens)}), append(y, d.StepS)
	}
	if f, e := fitNonNegative(x, y); e == nil {
		p.r.DecodeFit = &f
	} else if err == nil {
		err = fmt.Errorf("decode: %w (%d batches measured)", e, len(y))
	}
	return err
}

// chunkStreams are the residents decoding while chunked prefills one long prompt beside them.
const chunkStreams = 4

// chunked measures how the engine prefills a prompt that reaches it beside a decode batch:
// chunkStreams streams decode, then one prompt of up to 16,384 tokens arrives. An engine without
// chunked prefill runs the prompt in one step while the batch waits: the residents see one long
// gap. One with a budget (vLLM V1's max_num_batched_tokens) carries the batch's tokens and a
// chunk of the prompt in every step: the residents see k widened steps, the last with what is
// left, so the budget is about the prompt's tokens over (k-1 + the last chunk's share) plus the
// streams; the share is the last widened step's extra time over the one before it.
func (p *run) chunked(deadline time.Time) error {
	n := min(p.r.PromptTop-64, 16384)
	if n < 2048 {
		p.note("chunked prefill not measured: prompts of %d tokens at most (2,048 needed)", n)
		return nil
	}
	stepS := 0.02
	if f := p.r.DecodeFit; f != nil {
		stepS = max(f.Coef[0]+f.Coef[1]*chunkStreams, 1e-3)
	}
	lead := time.Duration((p.prefillSeconds(64)*chunkStreams + 20*stepS) * float64(time.Second))
	// The residents decode across the prompt's prefill and well after it: chunked beside them,
	// it takes its curve's time and a decode step per chunk (a budget of 256 at the least).
	span := lead.Seconds() + 2*p.prefillSeconds(n) + float64(n/256)*stepS + 0.3
	output := min(max(int(span/stepS), 64), 8192)
	if time.Until(deadline) < time.Duration(1.2*span*float64(time.Second)) {
		p.note("chunked prefill not measured: no budget left for it")
		return nil
	}
	p.progress("chunked", 0, 1, "")
	ctx := p.ctx
	residents := make([]Trace, chunkStreams)
	errs := make([]error, chunkStreams+1)
	var wg sync.WaitGroup
	for i := range residents {
		wg.Go(func() {
			residents[i], errs[i] = p.probe.Engine.Stream(ctx, Request{Prompt: p.probe.Prompt(64), MaxTokens: output})
		})
	}
	select { // the residents settle into the batch: a measurement's wait, not a synchronisation
	case <-time.After(lead):
	case <-ctx.Done():
	}
	prompt, perr := p.probe.Engine.Stream(ctx, Request{Prompt: p.probe.Prompt(n), MaxTokens: 1})
	errs[chunkStreams] = perr
	wg.Wait()
	p.progress("chunked", 1, 1, "")
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("chunked prefill: %w", err)
	}
	budget, steps, ok := chunkBudget(residents, prompt, n)
	if !ok {
		p.note("chunked prefill not measured: the residents did not decode across the prompt's prefill")
		return nil
	}
	p.r.ChunkBudget, p.r.ChunkSteps, p.r.ChunkMeasured = budget, steps, true
	return nil
}

// chunkBudget reads the residents' token gaps around one prompt's prefill (chunked); ok is
// false when a resident did not decode across it.
func chunkBudget(residents []Trace, prompt Trace, n int) (budget, steps int, ok bool) {
	if len(prompt.Tokens) == 0 {
		return 0, 0, false
	}
	if prompt.PromptTokens > 0 {
		n = prompt.PromptTokens
	}
	from, to := prompt.Sent, prompt.Tokens[0]
	var counts []int
	var shares []float64
	for _, r := range residents {
		var before []float64
		for i := 1; i < len(r.Tokens) && r.Tokens[i].Before(from); i++ {
			before = append(before, r.Tokens[i].Sub(r.Tokens[i-1]).Seconds())
		}
		if len(before) < 5 || !r.Tokens[len(r.Tokens)-1].After(to) {
			return 0, 0, false
		}
		base := median(before)
		// The resident's widened steps from the prompt's arrival to a few steps past its first
		// token: each chunk widens one; an unchunked prefill widens the one step that spans it.
		// Past the prompt the steps are plain again (which makes the window's end harmless to
		// the clients' few milliseconds of noise in telling which token came first); a late
		// timer delays tokens, never adds one, and a gap that only a late timer widened is
		// told from a chunk's by its size.
		end := to.Add(time.Duration(3 * base * float64(time.Second)))
		var extra []float64
		for i := len(before) + 1; i < len(r.Tokens) && !r.Tokens[i].After(end); i++ {
			if g := r.Tokens[i].Sub(r.Tokens[i-1]).Seconds(); g > 1.5*base {
				extra = append(extra, g-base)
			}
		}
		if len(extra) > 0 {
			big := 0.5 * median(extra)
			extra = slices.DeleteFunc(extra, func(e float64) bool { return e < big })
		}
		counts = append(counts, len(extra))
		if k := len(extra); k >= 2 {
			shares = append(shares, min(1, extra[k-1]/extra[k-2]))
		}
	}
	slices.Sort(counts)
	k := counts[len(counts)/2]
	if k <= 1 {
		// No token while it was prefilled (the batch waited the whole prefill), or one step
		// that carried it all: a budget above the prompt times it as unchunked does, but for
		// one decode step, and a client cannot tell the two apart by a few milliseconds.
		return 0, k, true
	}
	share := 1.0
	if len(shares) > 0 {
		share = median(shares)
	}
	return int(math.Round(float64(n)/(float64(k-1)+share))) + len(residents), k, true
}

// prefillSeconds is the fitted prefill time of n tokens (a guess of 1 ms a token before the fit).
func (p *run) prefillSeconds(n int) float64 {
	if f := p.r.PrefillFit; f != nil {
		x := float64(n)
		return f.Coef[0] + f.Coef[1]*x + f.Coef[2]*x*x
	}
	return 0.001 * float64(n)
}

// step is a batch's decode step time: over the window in which every stream was decoding (from
// the last first token to the first last token), each stream's seconds per token, averaged.
func (b *batch) step() (DecodePoint, bool) {
	var start, end time.Time
	for i, t := range b.traces {
		if len(t.Tokens) == 0 {
			return DecodePoint{}, false
		}
		if f := t.Tokens[0]; i == 0 || f.After(start) {
			start = f
		}
		if l := t.Tokens[len(t.Tokens)-1]; i == 0 || l.Before(end) {
			end = l
		}
	}
	mid := start.Add(end.Sub(start) / 2)
	var steps []float64
	kv := 0
	for _, t := range b.traces {
		var in []time.Time
		at := 0
		for i, x := range t.Tokens {
			if !x.Before(start) && !x.After(end) {
				in = append(in, x)
			}
			if !x.After(mid) {
				at = i + 1
			}
		}
		if len(in) < 4 {
			return DecodePoint{}, false
		}
		steps = append(steps, in[len(in)-1].Sub(in[0]).Seconds()/float64(len(in)-1))
		kv += t.PromptTokens + at
	}
	return DecodePoint{Streams: len(b.traces), PromptTokens: b.traces[0].PromptTokens, KVTokens: kv, StepS: mean(steps)}, true
}

// kvFromSamples estimates the KV capacity from the scrapes taken while every stream decoded:
// the resident tokens (prompts plus tokens received) over the usage the engine reported.
func (p *run) kvFromSamples(b *batch) {
	for _, s := range b.samples {
		resident, decoding := 0, 0
		for _, t := range b.traces {
			got := 0
			for _, x := range t.Tokens {
				if x.Before(s.at) {
					got++
				}
			}
			if got > 0 && t.End.After(s.at) {
				resident += t.PromptTokens + got
				decoding++
			}
		}
		if decoding == len(b.traces) && s.m.HasKVUsage && s.m.KVUsage > 0.005 {
			p.kvSeen = append(p.kvSeen, float64(resident)/s.m.KVUsage)
		}
	}
}

// limits finds max_streams (short prompts, batches doubling until the engine queues) and
// max_kv_tokens (vLLM's cache_config_info, else its KV usage while the decode batches ran, else
// long prompts until the engine queues).
func (p *run) limits(deadline time.Time) error {
	out := p.o.DecodeTokens
	const short = 16
	if !p.r.MaxStreams.Reached {
		p.r.MaxStreams = Limit{Value: p.o.MaxBatch, How: fmt.Sprintf("no queueing up to %d streams", p.o.MaxBatch)}
		// Batches as large as the budget affords (up to MaxStreamsProbe), each at least twice
		// the last: the engine queues what it cannot run, and the plateau is the limit.
		for tried := p.o.MaxBatch; ; {
			left := time.Until(deadline).Seconds() - float64(out)*0.05
			b := min(p.o.MaxStreamsProbe, int(0.8*left/p.prefillSeconds(short)))
			if b < 2*tried {
				if tried == p.o.MaxBatch {
					p.note("limits: the budget left no time for a stream probe above %d streams", p.o.MaxBatch)
				}
				break
			}
			p.progress("limits", 0, 2, fmt.Sprintf("%d streams", b))
			bt := p.probe.batch(p.ctx, b, short, out, p.r.HasMetrics)
			if bt.err != nil {
				return fmt.Errorf("limits, %d streams: %w", b, bt.err)
			}
			if n, how, ok := bt.streamLimit(); ok {
				p.r.MaxStreams = Limit{Value: n, Reached: true, How: how}
				break
			}
			p.r.MaxStreams = Limit{Value: b, How: fmt.Sprintf("no queueing with %d streams", b)}
			p.kvFromSamples(&bt)
			p.kvRan = max(p.kvRan, b*(short+out))
			if tried = b; b == p.o.MaxStreamsProbe {
				break
			}
		}
	}
	p.progress("limits", 1, 2, "KV")
	switch {
	case p.metrics0.KVCapacity > 0 && p.kvRan > p.metrics0.KVCapacity:
		// The engine's KV cache as it reports it does not bind: batches holding more ran
		// without queueing (an emulator that does not model its cache; a cache config read
		// wrong). What ran is a floor.
		p.r.MaxKV = Limit{Value: p.kvRan, How: fmt.Sprintf("%d KV tokens ran without queueing, more than the engine's reported KV cache (%d)", p.kvRan, p.metrics0.KVCapacity)}
		p.note("limits: the engine reports a KV cache of %d tokens, but batches holding %d ran without queueing: max_kv_tokens is what ran, a floor (probe further with --max-batch)", p.metrics0.KVCapacity, p.kvRan)
	case p.metrics0.KVCapacity > 0:
		p.r.MaxKV = Limit{Value: p.metrics0.KVCapacity, Reached: true, How: "the engine's reported KV cache (vllm:cache_config_info num_gpu_blocks × block_size, or sglang:max_total_num_tokens)"}
	case len(p.kvSeen) > 0:
		p.r.MaxKV = Limit{Value: int(median(p.kvSeen)), Reached: true,
			How: fmt.Sprintf("resident tokens / vllm:kv_cache_usage_perc, the median of %d scrapes", len(p.kvSeen))}
	default:
		return p.kvKnee(deadline)
	}
	return nil
}

// streamLimit reports whether the engine queued some of a batch's streams behind others, and
// how many it ran at once: with metrics, the most vllm:num_requests_running showed when that
// never reached the batch while some waited; without, the streams whose first token came before
// any stream ended (the latency knee).
func (b *batch) streamLimit() (int, string, bool) {
	if len(b.samples) > 0 {
		maxRun, waited := 0.0, false
		for _, s := range b.samples {
			maxRun = max(maxRun, s.m.Running)
			waited = waited || s.m.Waiting > 0
		}
		if waited && maxRun > 0 && int(maxRun) < len(b.traces) {
			return int(maxRun), "the most vllm:num_requests_running while requests waited", true
		}
		return 0, "", false
	}
	if n := b.concurrent(); n < len(b.traces) {
		return n, "streams that had their first token before the first ended (the latency knee)", true
	}
	return 0, "", false
}

// kvKnee finds the KV limit without metrics: long prompts, batches doubling until the engine
// queues; the limit is then between n and n+1 requests' worth.
func (p *run) kvKnee(deadline time.Time) error {
	long := min(4096, p.r.PromptTop/2)
	out := p.o.DecodeTokens
	per := 0
	for b := 4; b <= 4*p.o.MaxStreamsProbe; b *= 2 {
		if left := time.Until(deadline).Seconds(); float64(b)*p.prefillSeconds(long)+float64(out)*0.05 > left {
			p.note("limits: the budget stopped the KV probe before %d streams of %d tokens", b, long)
			break
		}
		p.progress("limits", 1, 2, fmt.Sprintf("KV: %d streams × %d tokens", b, long))
		bt := p.probe.batch(p.ctx, b, long, out, p.r.HasMetrics)
		if bt.err != nil {
			return fmt.Errorf("limits, %d streams of %d tokens: %w", b, long, bt.err)
		}
		per = bt.traces[0].PromptTokens + out
		if n := bt.concurrent(); n < b {
			if p.r.MaxStreams.Reached && n >= p.r.MaxStreams.Value {
				break // the stream limit, not KV, stopped it
			}
			p.r.MaxKV = Limit{Value: n*per + per/2, Reached: true,
				How: fmt.Sprintf("%d streams of %d tokens ran at once (the latency knee; ±%d tokens)", n, per, per/2)}
			return nil
		}
		p.r.MaxKV = Limit{Value: b * per, How: fmt.Sprintf("no queueing with %d streams of %d tokens", b, per)}
	}
	if p.r.MaxKV.Value == 0 {
		p.r.MaxKV = Limit{Value: max(per, p.r.PromptTop), How: "not measured: the context limit, a lower bound"}
	}
	return nil
}

// handoff measures kv_transfer_s through o.Prefiller: a request to the engine that names the
// prefiller (the handoff header) against the same prompt prefilled on the prefiller alone; the
// difference less one decode step and one round trip is the handoff.
func (p *run) handoff(deadline time.Time) error {
	if p.o.Prefiller == nil {
		return nil
	}
	u, err := url.Parse(p.o.Prefiller.URL)
	if err != nil {
		return err
	}
	h := http.Header{}
	h.Set(wire.HeaderPrefiller, u.Host)
	lengths := slices.Compact([]int{256, min(1024, p.r.PromptTop), min(4096, p.r.PromptTop)})
	for i, n := range lengths {
		// The fastest of the repeats on each side (what the machine adds only adds time), so
		// one estimate a length.
		var alone, via []time.Duration
		tokens := 0
		for range p.o.Repeats {
			if time.Now().After(deadline.Add(p.o.Budget / 20)) {
				p.note("handoff: the budget ended it after %d lengths", len(p.r.KVTransfer))
				return nil
			}
			p.progress("handoff", i, len(lengths), fmt.Sprintf("%d tokens", n))
			// Two prompts of one length, each new to the prefiller's prefix cache.
			a, err := p.o.Prefiller.Stream(p.ctx, Request{Prompt: p.probe.Prompt(n), MaxTokens: 1})
			if err != nil {
				return fmt.Errorf("handoff: the prefiller alone: %w", err)
			}
			v, err := p.o.Engine.Stream(p.ctx, Request{Prompt: p.probe.Prompt(n), MaxTokens: 2, Header: h})
			if err != nil {
				return fmt.Errorf("handoff: a request pulling from the prefiller %s: %w", u.Host, err)
			}
			alone, via, tokens = append(alone, a.TTFT()), append(via, v.TTFT()), v.PromptTokens
		}
		step := 0.0
		if f := p.r.DecodeFit; f != nil {
			step = f.Coef[0] + f.Coef[1] + f.Coef[2]*float64(tokens)
		}
		// via has one round trip more than alone: the engine's to the prefiller.
		p.r.KVTransfer = append(p.r.KVTransfer, max(0, (slices.Min(via)-slices.Min(alone)-p.probe.RTT).Seconds()-step))
	}
	return nil
}

// Profile is the fitted profile; ok is false when neither curve could be fitted.
func (r *Result) Profile() (config.Profile, bool) {
	prof := config.Profile{PrefillConcurrency: config.DefaultProfile().PrefillConcurrency, KVTransferS: config.DefaultProfile().KVTransferS}
	if f := r.PrefillFit; f != nil {
		top := 0
		for _, pt := range r.Prefill {
			top = max(top, pt.PromptTokens)
		}
		prof.Prefill = &config.PrefillCurve{BaseS: f.Coef[0], PerTokenS: f.Coef[1], PerToken2S: f.Coef[2], MaxTokens: top}
	}
	if f := r.DecodeFit; f != nil {
		prof.Decode = &config.DecodeCurve{BaseS: f.Coef[0], PerStreamS: f.Coef[1], PerKVTokenS: f.Coef[2],
			MaxStreams: max(1, r.MaxStreams.Value), MaxKVTokens: max(1, r.MaxKV.Value)}
	}
	if len(r.KVTransfer) > 0 {
		prof.KVTransferS = median(r.KVTransfer)
	}
	if prof.Prefill != nil {
		prof.ChunkedPrefill.BudgetTokens = r.ChunkBudget
	}
	return prof, prof.Prefill != nil || prof.Decode != nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return math.NaN()
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func mean(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// roundTrip is the fastest of 7 round trips of GET /v1/models: what a busy machine adds only
// adds time, and taking off more than the network's share would make the engine look faster.
func roundTrip(ctx context.Context, e *Engine) (time.Duration, error) {
	var d []float64
	for range 7 {
		begin := time.Now()
		if _, err := e.Models(ctx); err != nil {
			return 0, err
		}
		d = append(d, float64(time.Since(begin)))
	}
	return time.Duration(slices.Min(d)), nil
}

// sizer makes prompts of a wanted token count from the engine's own count: a prompt of k
// units is offset + perUnit·k tokens, measured at two lengths.
type sizer struct{ offset, perUnit float64 }

const unit = " the" // one token for common BPE vocabularies and for enginesim (4 bytes)

func (s sizer) prompt(n, id int) string {
	head := "[" + strconv.Itoa(id) + "]"
	k := max(1, int(math.Round((float64(n)-s.offset)/s.perUnit)))
	return head + strings.Repeat(unit, k)
}

// calibrate measures the engine's token count of prompts of 64 and 1,024 units.
func calibrate(ctx context.Context, e *Engine) (sizer, error) {
	count := func(k int) (int, error) {
		tr, err := e.Stream(ctx, Request{Prompt: "[0]" + strings.Repeat(unit, k), MaxTokens: 1})
		if err != nil {
			return 0, fmt.Errorf("a first completion: %w", err)
		}
		if tr.PromptTokens == 0 {
			return 0, fmt.Errorf("%s: the stream carries no usage.prompt_tokens (stream_options.include_usage): prompts are sized by the engine's own count", e.URL)
		}
		return tr.PromptTokens, nil
	}
	a, err := count(64)
	if err != nil {
		return sizer{}, err
	}
	b, err := count(1024)
	if err != nil {
		return sizer{}, err
	}
	per := float64(b-a) / 960
	if per <= 0 {
		return sizer{}, fmt.Errorf("%s: the engine counts %d tokens in 64 words and %d in 1,024", e.URL, a, b)
	}
	return sizer{offset: float64(a) - 64*per, perUnit: per}, nil
}
