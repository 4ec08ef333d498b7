package sim

import (
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/narwhal-llm/narwhal/fleet"
)

// WritePlot draws the report as one SVG: a row per policy, each with three panels over the
// replay's time (seconds from its start) — the offered rate, TTFT p99 against the SLO (log
// scale over whole decades that hold every window's p99 and the SLO), and the split (prefill
// engines of the fleet) with every role change marked — each with its y-axis ticks, so that a
// person sees at a glance where a policy missed and what it did about it.
func (rep *Report) WritePlot(w io.Writer) {
	const (
		width, left, right = 960, 70, 20
		panelH, gap, rowH  = 60, 14, 3*60 + 3*14 + 30
	)
	plotW := float64(width - left - right)
	height := 40 + rowH*len(rep.Policies)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%d" y="22" font-size="14" font-weight="bold">%s: %d requests over %.0f s, %d engines (SLO TTFT %gs, TPOT %gs)</text>`+"\n",
		left, esc(rep.Trace), rep.Requests, rep.SpanS, rep.Engines, rep.SLO.TTFTS, rep.SLO.TPOTS)
	span := math.Max(rep.SpanS, 1)
	x := func(t float64) float64 { return float64(left) + plotW*math.Min(t/span, 1) }
	peakRate := 0.0
	lo, hi := rep.SLO.TTFTS, rep.SLO.TTFTS // the TTFT panel's range: every p99 and the SLO
	for _, p := range rep.Policies {
		for _, win := range p.Windows {
			peakRate = math.Max(peakRate, float64(win.Offered)/rep.WindowS)
			if v := win.TTFTP99; v != nil && *v > 0 {
				lo, hi = math.Min(lo, *v), math.Max(hi, *v)
			}
		}
	}
	decLo, decHi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if decHi == decLo {
		decHi++
	}
	for row, p := range rep.Policies {
		top := 40 + row*rowH
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="12" font-weight="bold">%s%s — attainment %.3f, %d role changes</text>`+"\n",
			left, top+10, esc(p.Policy), esc(splitNote(p)), p.SLOAttainment, p.RoleChanges)
		panel := func(k int, label string) (y0, y1 float64) {
			y0 = float64(top + 18 + k*(panelH+gap))
			y1 = y0 + panelH
			fmt.Fprintf(&b, `<rect x="%d" y="%.1f" width="%.1f" height="%d" fill="#fafafa" stroke="#ccc"/><text x="4" y="%.1f">%s</text>`+"\n", left, y0, plotW, panelH, y0+panelH/2+4, label)
			return y0, y1
		}
		tick := func(y float64, label string) {
			fmt.Fprintf(&b, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#e4e4e4"/><text x="%d" y="%.1f" fill="#666" text-anchor="end" font-size="9">%s</text>`+"\n",
				left, float64(left)+plotW, y, y, left-3, y+3, label)
		}
		// Offered rate.
		y0, y1 := panel(0, "req/s")
		tick(y0, fmt.Sprintf("%.0f", peakRate))
		tick(y1, "0")
		var pts []string
		for _, win := range p.Windows {
			r := float64(win.Offered) / rep.WindowS
			y := y1 - (y1-y0)*r/math.Max(peakRate, 1e-9)
			pts = append(pts, fmt.Sprintf("%.1f,%.1f %.1f,%.1f", x(win.StartS), y, x(win.StartS+rep.WindowS), y))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="#4477aa" stroke-width="1.5" points="%s"/>`+"\n", strings.Join(pts, " "))
		// TTFT p99 against the SLO, log scale over whole decades.
		y0, y1 = panel(1, "TTFT p99")
		logY := func(v float64) float64 { return y1 - (y1-y0)*(math.Log10(v)-decLo)/(decHi-decLo) }
		for d := decLo; d <= decHi; d++ {
			tick(logY(math.Pow(10, d)), secsText(math.Pow(10, d)))
		}
		fmt.Fprintf(&b, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#cc3311" stroke-dasharray="4 3"/><text x="%.1f" y="%.1f" fill="#cc3311">SLO</text>`+"\n",
			left, float64(left)+plotW, logY(rep.SLO.TTFTS), logY(rep.SLO.TTFTS), float64(left)+plotW-24, logY(rep.SLO.TTFTS)-3)
		pts = pts[:0]
		for _, win := range p.Windows {
			if win.TTFTP99 != nil && *win.TTFTP99 > 0 {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(win.StartS+rep.WindowS/2), logY(*win.TTFTP99)))
			}
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="#222" stroke-width="1.5" points="%s"/>`+"\n", strings.Join(pts, " "))
		// The split: prefill engines of the fleet, role changes marked.
		y0, y1 = panel(2, "prefill")
		n := max(rep.Engines, 1)
		for _, k := range []int{0, n / 2, n} {
			tick(y1-(y1-y0)*float64(k)/float64(n), fmt.Sprint(k))
		}
		// A step at each move, from the starting split.
		if s := rep.runs[p.Policy]; s != nil {
			pf, _ := initialSplit(s)
			y := func(k int) float64 { return y1 - (y1-y0)*float64(k)/float64(n) }
			pts = append(pts[:0], fmt.Sprintf("%.1f,%.1f", x(0), y(pf)))
			for _, m := range s.moves {
				t := m.at.Sub(Epoch).Seconds()
				before := pf
				if m.to == fleet.Prefill {
					pf++
				} else {
					pf--
				}
				pts = append(pts, fmt.Sprintf("%.1f,%.1f %.1f,%.1f", x(t), y(before), x(t), y(pf)))
				fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ee7733"><title>%.0f s: %s to %s (%s)</title></line>`+"\n", x(t), x(t), y0, y1, t, esc(m.engine), m.to, esc(m.caller))
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(span), y(pf)))
			fmt.Fprintf(&b, `<polyline fill="none" stroke="#228833" stroke-width="2" points="%s"/>`+"\n", strings.Join(pts, " "))
		}
		for k := 0; k <= 4; k++ {
			anchor := map[int]string{0: "start", 4: "end"}[k]
			if anchor == "" {
				anchor = "middle"
			}
			t := rep.SpanS * float64(k) / 4
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#666" text-anchor="%s">%.0f s</text>`+"\n", x(t), y1+12, anchor, t)
		}
	}
	b.WriteString("</svg>\n")
	_, _ = io.WriteString(w, b.String())
}

func splitNote(p PolicyReport) string {
	if p.Split == "" {
		return ""
	}
	return " (" + p.Split + ")"
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}

// secsText is seconds for an axis label.
func secsText(v float64) string {
	switch {
	case v >= 1:
		return fmt.Sprintf("%g s", v)
	case v >= 1e-3:
		return fmt.Sprintf("%g ms", v*1e3)
	}
	return fmt.Sprintf("%g µs", v*1e6)
}
