package profiler

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// WriteYAML writes the fitted profile as a `profiles:` block named name, with how it was
// measured, the fits' quality, the limits' provenance and the notes as comments, and the
// measured points (per-length medians and the decode batches) as comments at the end — so a
// cut-short run keeps what it measured. It reports whether a profile was written (false: only
// comments, nothing could be fitted).
func (r *Result) WriteYAML(w io.Writer, name string) bool {
	var b strings.Builder
	c := func(format string, args ...any) { fmt.Fprintf(&b, "# "+format+"\n", args...) }
	c("narwhal profile of %s, model %s: %s", r.URL, r.Model, r.Elapsed.Round(100_000_000))
	if r.Err != nil {
		c("INCOMPLETE: %v", r.Err)
		c("the curves below are fitted to what was measured before that")
	}
	for _, n := range r.Notes {
		c("note: %s", n)
	}
	if f := r.PrefillFit; f != nil {
		pt := r.medians()[f.WorstAt]
		c("prefill fit over %d prompt lengths (%d prefills): R² %.5f, worst residual %.1f%% at %d tokens", len(r.medians()), len(r.Prefill), f.R2, 100*f.Worst, pt.PromptTokens)
	}
	if f := r.DecodeFit; f != nil {
		d := r.Decode[f.WorstAt]
		c("decode fit over %d batches: R² %.5f, worst residual %.1f%% at %d streams, %d KV tokens", len(r.Decode), f.R2, 100*f.Worst, d.Streams, d.KVTokens)
	}
	c("max_streams: %s", limitNote(r.MaxStreams))
	c("max_kv_tokens: %s", limitNote(r.MaxKV))
	if len(r.KVTransfer) > 0 {
		c("kv_transfer_s: the median over %d prompt lengths of the handoff through the prefiller", len(r.KVTransfer))
	}
	c("prefill_concurrency is Narwhal's dispatch depth, not measured: the default")
	switch {
	case !r.ChunkMeasured:
	case r.ChunkSteps > 1:
		c("chunked_prefill: a prompt beside %d decoding streams widened %d of their steps: a budget of about %d tokens a step", chunkStreams, r.ChunkSteps, r.ChunkBudget)
	default:
		c("chunked_prefill 0: the decoding streams waited the whole prefill of a prompt beside them (no chunked prefill, or a budget above the prompt)")
	}
	if r.Together > 0 {
		c("prefill of %d prompts of %d tokens at once: the last first token after %.2f of the time one after another (1 = one at a time, as projected)", r.TogetherPrompts, r.TogetherTokens, r.Together)
	}
	if len(r.KVTransfer) > 0 && slices.Max(r.KVTransfer) == 0 {
		c("kv_transfer_s 0: the first token through the prefiller came no later than the prefill alone plus one decode step (an engine that streams its first token as soon as the KV arrives)")
	}
	prof, ok := r.Profile()
	if ok {
		fmt.Fprintf(&b, "profiles:\n  %s:\n", name)
		if p := prof.Prefill; p != nil {
			fmt.Fprintf(&b, "    prefill: {base_s: %s, per_token_s: %s, per_token2_s: %s, max_tokens: %d}\n", g(p.BaseS), g(p.PerTokenS), g(p.PerToken2S), p.MaxTokens)
		}
		fmt.Fprintf(&b, "    prefill_concurrency: %d\n", prof.PrefillConcurrency)
		if d := prof.Decode; d != nil {
			fmt.Fprintf(&b, "    decode: {base_s: %s, per_stream_s: %s, per_kv_token_s: %s, max_streams: %d, max_kv_tokens: %d}\n",
				g(d.BaseS), g(d.PerStreamS), g(d.PerKVTokenS), d.MaxStreams, d.MaxKVTokens)
		}
		fmt.Fprintf(&b, "    kv_transfer_s: %s\n", g(prof.KVTransferS))
		fmt.Fprintf(&b, "    chunked_prefill: {budget_tokens: %d}\n", prof.ChunkedPrefill.BudgetTokens)
	} else {
		c("no curve could be fitted: the measurements follow")
	}
	c("measured prefills (prompt tokens, time to first token s, the fastest of each length):")
	for _, pt := range r.medians() {
		c("  %d %.6f", pt.PromptTokens, pt.TTFTS)
	}
	c("measured decode batches (streams, prompt tokens, KV tokens, step s):")
	for _, d := range r.Decode {
		c("  %d %d %d %.6f", d.Streams, d.PromptTokens, d.KVTokens, d.StepS)
	}
	_, _ = io.WriteString(w, b.String())
	return ok
}

func limitNote(l Limit) string {
	if l.Value == 0 {
		return "not measured"
	}
	s := strconv.Itoa(l.Value) + " (" + l.How + ")"
	if !l.Reached {
		s += ", a lower bound"
	}
	return s
}

// g formats a coefficient with 4 significant digits, the way YAML reads it back.
func g(v float64) string {
	if v == 0 {
		return "0"
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

// medians are the prefill measurements grouped by prompt length (the engine's count within 2%):
// the median length and the fastest time of each group, in order. The fastest, because what
// the machine adds (a late timer, a busy core, a garbage collection) only ever adds time.
func (r *Result) medians() []PrefillPoint {
	var out []PrefillPoint
	var group []PrefillPoint
	flush := func() {
		if len(group) == 0 {
			return
		}
		var n, t []float64
		for _, p := range group {
			n, t = append(n, float64(p.PromptTokens)), append(t, p.TTFTS)
		}
		out = append(out, PrefillPoint{PromptTokens: int(math.Round(median(n))), TTFTS: slices.Min(t)})
		group = group[:0]
	}
	for _, p := range r.Prefill {
		if len(group) > 0 && math.Abs(float64(p.PromptTokens-group[0].PromptTokens)) > 0.02*float64(group[0].PromptTokens)+1 {
			flush()
		}
		group = append(group, p)
	}
	flush()
	return out
}
