package profiler

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The profile's picture: batches whose prompts differ by a token (an engine counting a special
// token: 64 and 65) are one series with one label, and no fitted line leaves its panel, even
// where the fit climbs above every measured point.
func TestPlotSeriesAndBounds(t *testing.T) {
	r := &Result{URL: "http://e", Model: "m",
		Prefill:    []PrefillPoint{{PromptTokens: 32, TTFTS: 0.01}, {PromptTokens: 1024, TTFTS: 0.03}},
		PrefillFit: &Fit{Coef: []float64{0.01, 2e-5, 1e-8}}, // climbs over the points by 1024 tokens
		DecodeFit:  &Fit{Coef: []float64{0.004, 1e-4, 1e-7}},
		MaxStreams: Limit{Value: 64}, MaxKV: Limit{Value: 1 << 20},
	}
	for _, s := range []int{1, 8, 16} {
		for _, p := range []int{64, 65, 1024} {
			r.Decode = append(r.Decode, DecodePoint{Streams: s, PromptTokens: p, KVTokens: s * (p + 64), StepS: 0.004 + 5e-5*float64(s)})
		}
	}
	var b bytes.Buffer
	r.WritePlot(&b)
	svg := b.String()
	if n := strings.Count(svg, ">prompt 64 tokens<"); n != 1 || strings.Contains(svg, "prompt 65 tokens") || !strings.Contains(svg, ">prompt 1024 tokens<") {
		t.Errorf("series labels: want one for 64 (holding 65) and one for 1024:\n%s", svg)
	}
	const top, bottom = 50, 350 // the panels' frame (WritePlot's top and top+panelH)
	for _, m := range regexp.MustCompile(`(?:cy="|,)(-?[0-9.]+)`).FindAllStringSubmatch(svg, -1) {
		if y, _ := strconv.ParseFloat(m[1], 64); y < top-0.5 || y > bottom+0.5 {
			t.Errorf("a point at y=%g, outside the panel [%d, %d]", y, top, bottom)
		}
	}
	// Nor is a line clamped flat along the top: the axis holds the whole line.
	for _, pl := range regexp.MustCompile(`<polyline [^>]*points="([^"]*)"`).FindAllStringSubmatch(svg, -1) {
		atTop := 0
		for _, pt := range strings.Fields(pl[1]) {
			if y, _ := strconv.ParseFloat(pt[strings.IndexByte(pt, ',')+1:], 64); y < top+0.5 {
				atTop++
			}
		}
		if atTop > 1 {
			t.Errorf("a fitted line runs along the top of its panel (%d points there): clamped", atTop)
		}
	}
}
