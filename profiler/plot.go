package profiler

import (
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
)

// WritePlot draws the measurements and the fitted curves as one SVG: the time to first token
// against prompt tokens (every prefill a dot, the fitted curve a line), and the decode step
// against streams (a dot per batch, coloured by its prompt length, with the fitted line of each
// prompt length).
func (r *Result) WritePlot(w io.Writer) {
	const (
		width, height     = 960, 400
		panelW, panelH    = 400, 300
		left1, left2, top = 70, 550, 50
	)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%d" y="24" font-size="14" font-weight="bold">%s</text>`+"\n",
		left1, html.EscapeString(fmt.Sprintf("narwhal profile: %s, model %s", r.URL, r.Model)))
	prof, _ := r.Profile()
	frame := func(x0 int, title, xl, yl string, xMax, yMax float64) {
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="#fafafa" stroke="#ccc"/>`+"\n", x0, top, panelW, panelH)
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", x0, top-8, html.EscapeString(title))
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" fill="#666">%s %s</text>`+"\n", x0+panelW, top+panelH+28, html.EscapeString(xl), g(xMax))
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#666">0</text>`+"\n", x0, top+panelH+14)
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" fill="#666">%s</text><text x="%d" y="%d" text-anchor="end" fill="#666">%s</text>`+"\n",
			x0-4, top+10, g(yMax), x0-4, top+24, html.EscapeString(yl))
	}
	// Prefill.
	xMax, yMax := 1.0, 1e-3
	for _, p := range r.Prefill {
		xMax, yMax = math.Max(xMax, float64(p.PromptTokens)), math.Max(yMax, p.TTFTS)
	}
	if c := prof.Prefill; c != nil {
		yMax = math.Max(yMax, c.Seconds(int(xMax)))
	}
	yMax *= 1.1
	px := func(v float64) float64 { return left1 + panelW*v/xMax }
	py := func(v float64) float64 { return top + panelH - panelH*v/yMax }
	frame(left1, "prefill: time to first token (s) against prompt tokens", "prompt tokens", "s", xMax, yMax)
	for _, p := range r.Prefill {
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="#4477aa"><title>%d tokens: %.4f s</title></circle>`+"\n", px(float64(p.PromptTokens)), py(p.TTFTS), p.PromptTokens, p.TTFTS)
	}
	if c := prof.Prefill; c != nil {
		var pts []string
		for i := range 101 {
			n := xMax * float64(i) / 100
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(n), py(c.Seconds(int(n)))))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="#cc3311" stroke-width="1.5" points="%s"/>`+"\n", strings.Join(pts, " "))
	}
	// Decode. Batches whose prompts differ by a token or two (an engine counting a special token)
	// are one series: one per prompt length asked for.
	xMax, yMax = 1, 1e-3
	var contexts []int
	for _, d := range r.Decode {
		xMax, yMax = math.Max(xMax, float64(d.Streams)), math.Max(yMax, d.StepS)
		contexts = append(contexts, d.PromptTokens)
	}
	slices.Sort(contexts)
	contexts = slices.Compact(contexts)
	var groups []int // the first prompt length of each series
	for _, c := range contexts {
		if n := len(groups); n == 0 || float64(c) > 1.05*float64(groups[n-1])+2 {
			groups = append(groups, c)
		}
	}
	group := func(ctx int) int {
		k := 0
		for i, g := range groups {
			if ctx >= g {
				k = i
			}
		}
		return k
	}
	// The fitted lines: the axis holds them too, so that none runs off the top.
	curves := make([][]float64, len(groups))
	if c := prof.Decode; c != nil {
		for i, ctx := range groups {
			for st := 1.0; st <= xMax; st++ {
				v := c.StepSeconds(int(st), int(st*float64(ctx+r.decodeTokens()/2)))
				curves[i] = append(curves[i], v)
				yMax = math.Max(yMax, v)
			}
		}
	}
	yMax *= 1.1
	dx := func(v float64) float64 { return left2 + panelW*v/xMax }
	dy := func(v float64) float64 { return top + panelH - panelH*v/yMax }
	frame(left2, "decode: step (s) against streams", "streams", "s", xMax, yMax)
	colours := []string{"#4477aa", "#228833", "#ee7733", "#aa3377", "#66ccee"}
	for i, ctx := range groups {
		col := colours[i%len(colours)]
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="%s">prompt %d tokens</text>`+"\n", left2+8, top+16+14*i, col, ctx)
		for _, d := range r.Decode {
			if group(d.PromptTokens) == i {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%d streams, %d KV tokens: %.5f s</title></circle>`+"\n", dx(float64(d.Streams)), dy(d.StepS), col, d.Streams, d.KVTokens, d.StepS)
			}
		}
		if len(curves[i]) > 0 {
			var pts []string
			for k, v := range curves[i] {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", dx(float64(k+1)), dy(v)))
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.2" points="%s"/>`+"\n", col, strings.Join(pts, " "))
		}
	}
	b.WriteString("</svg>\n")
	_, _ = io.WriteString(w, b.String())
}

// decodeTokens is the output of the decode batches, as the KV of their mid-window says.
func (r *Result) decodeTokens() int {
	for _, d := range r.Decode {
		if d.Streams > 0 {
			return 2 * max(0, d.KVTokens/d.Streams-d.PromptTokens)
		}
	}
	return 0
}
