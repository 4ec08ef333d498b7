package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/profiler"
)

func newProfile(stdout, stderr io.Writer) *cobra.Command {
	var (
		engineURL, model, name, out, plot, prefiller string
		budgetS                                      float64
		maxPrompt, maxBatch                          int
	)
	cmd := &cobra.Command{
		Use:   "profile --engine URL --model M [--name NAME] [--out FILE] [--plot FILE] [--prefiller URL] [--budget-s N]",
		Short: "Measure a live OpenAI-compatible engine and write the profiles.NAME block Narwhal prices work with",
		Long: "Measures a live engine (vLLM, SGLang, enginesim): the time to first token at a ladder of prompt\n" +
			"lengths, decode batches of concurrent streams at several context lengths, the stream and KV\n" +
			"limits, and (with --prefiller) the KV handoff; fits the profile's curves by least squares and\n" +
			"writes a profiles.NAME YAML block (stdout, or --out) with the fits' quality as comments.\n" +
			"A run cut short by the engine keeps and writes what it measured, and exits 1. docs/profiling.md.",
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if engineURL == "" || model == "" {
				return usageErr(fmt.Errorf("profile: --engine URL and --model M are required"))
			}
			if !config.IsName(name) {
				return usageErr(fmt.Errorf("profile: --name must use only A-Z a-z 0-9 . _ -, got %q", name))
			}
			e, err := profiler.NewEngine(engineURL, model)
			if err != nil {
				return usageErr(fmt.Errorf("--engine: %w", err))
			}
			bar := newBar(stderr)
			o := profiler.Options{Engine: e, MaxPromptTokens: maxPrompt, MaxBatch: maxBatch,
				Budget: time.Duration(budgetS * float64(time.Second)), Progress: bar.show}
			if prefiller != "" {
				if o.Prefiller, err = profiler.NewEngine(prefiller, model); err != nil {
					return usageErr(fmt.Errorf("--prefiller: %w", err))
				}
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			res, err := profiler.Run(ctx, o)
			bar.clear()
			if err != nil {
				return failureErr(fmt.Errorf("profile: %w", err))
			}
			var sb strings.Builder
			wrote := res.WriteYAML(&sb, name)
			fmt.Fprint(stderr, summary(res))
			if out == "" {
				fmt.Fprint(stdout, sb.String())
			} else if err := os.WriteFile(out, []byte(sb.String()), 0o644); err != nil {
				return failureErr(err)
			}
			if plot != "" {
				var pb strings.Builder
				res.WritePlot(&pb)
				if err := os.WriteFile(plot, []byte(pb.String()), 0o644); err != nil {
					return failureErr(err)
				}
			}
			switch {
			case res.Err != nil:
				return failureErr(fmt.Errorf("profile: cut short (what was measured is written): %w", res.Err))
			case !wrote:
				return failureErr(fmt.Errorf("profile: nothing could be fitted"))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&engineURL, "engine", "", "the engine's base URL (http://host:port)")
	f.StringVar(&model, "model", "", "the model it serves (as GET /v1/models names it)")
	f.StringVar(&name, "name", "measured", "the profile's name in the block written")
	f.StringVar(&out, "out", "", "write the block to this file (default stdout)")
	f.StringVar(&plot, "plot", "", "write an SVG of the measurements and the fitted curves")
	f.StringVar(&prefiller, "prefiller", "", "a prefill engine the measured one pulls KV from: measures kv_transfer_s")
	f.Float64Var(&budgetS, "budget-s", 300, "bound on the whole run, seconds")
	f.IntVar(&maxPrompt, "max-prompt-tokens", 0, "top of the prefill ladder (default: the engine's max_model_len, else 32768)")
	f.IntVar(&maxBatch, "max-batch", 64, "largest decode batch of the fit")
	return cmd
}

// phaseSpan is where each phase sits in the whole run, for the bar.
var phaseSpan = map[string][2]float64{"prefill": {0, 0.2}, "decode": {0.2, 0.6}, "limits": {0.6, 0.95}, "handoff": {0.95, 1}}

// bar draws the run's progress on w: a one-line bar when w is a terminal, else a line a phase.
type bar struct {
	w    io.Writer
	tty  bool
	last string
}

func newBar(w io.Writer) *bar {
	b := &bar{w: w}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil {
			b.tty = st.Mode()&os.ModeCharDevice != 0
		}
	}
	return b
}

func (b *bar) show(p profiler.Progress) {
	span := phaseSpan[p.Phase]
	frac := span[0]
	if p.Total > 0 {
		frac += (span[1] - span[0]) * float64(p.Done) / float64(p.Total)
	}
	if !b.tty {
		if p.Phase != b.last {
			fmt.Fprintf(b.w, "profile: %s (%.0f s of %.0f s)\n", p.Phase, p.Elapsed.Seconds(), p.Budget.Seconds())
			b.last = p.Phase
		}
		return
	}
	const width = 30
	n := int(frac * width)
	fmt.Fprintf(b.w, "\r\033[K[%s%s] %3.0f%% %s %d/%d · %.0f/%.0f s · %s", strings.Repeat("#", n), strings.Repeat("-", width-n),
		100*frac, p.Phase, p.Done, p.Total, p.Elapsed.Seconds(), p.Budget.Seconds(), p.Detail)
}

// clear ends the bar's line.
func (b *bar) clear() {
	if b.tty {
		fmt.Fprint(b.w, "\r\033[K")
	}
}

// summary is the fit quality, for the terminal.
func summary(r *profiler.Result) string {
	var b strings.Builder
	if f := r.PrefillFit; f != nil {
		fmt.Fprintf(&b, "prefill: %d prefills, R² %.5f, worst residual %.1f%%\n", len(r.Prefill), f.R2, 100*f.Worst)
	}
	if f := r.DecodeFit; f != nil {
		fmt.Fprintf(&b, "decode: %d batches, R² %.5f, worst residual %.1f%%\n", len(r.Decode), f.R2, 100*f.Worst)
	}
	fmt.Fprintf(&b, "max_streams %d, max_kv_tokens %d; %s\n", r.MaxStreams.Value, r.MaxKV.Value, r.Elapsed.Round(time.Second))
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	return b.String()
}
