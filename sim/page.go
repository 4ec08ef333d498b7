package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/history"
	"github.com/narwhal-llm/narwhal/page"
)

// Page is the report as the live page draws it (narwhal sim --plot FILE.html): one recorded
// history a policy, in /narwhal/history's shape.
func (rep *Report) Page(cfg *config.Config) page.Recorded {
	rec := page.Recorded{Title: "narwhal sim: " + rep.Trace}
	for _, p := range rep.Policies {
		s := rep.runs[p.Policy]
		if s == nil {
			continue
		}
		// A sample a window (the split at its end, the offered and admitted rate, the waiting set
		// at its end, the offers turned away by code, completions, TTFT and TPOT percentiles and
		// the TTFT attainment of the requests that arrived in it), and the replay's decisions
		// that moved (or would have).
		h := history.Document[json.RawMessage]{Epoch: Epoch, IntervalS: rep.WindowS, Advisory: cfg.Controller.Advisory, SLO: cfg.SLO,
			Samples: rep.samples(cfg, p, s), Decisions: decisionLines(rep.logs[p.Policy])}
		h.Capacity = history.Capacity{Samples: len(h.Samples), Decisions: len(h.Decisions)}
		rec.Runs = append(rec.Runs, page.Run{Name: p.Policy, History: h})
	}
	return rec
}

func (rep *Report) samples(cfg *config.Config, p PolicyReport, s *run) []history.Sample {
	out := make([]history.Sample, len(p.Windows))
	ttft, tpot := make([][]float64, len(out)), make([][]float64, len(out))
	within := make([]int, len(out))
	for i := range s.out {
		o := &s.out[i]
		w := min(int(s.reqs[i].ArrivalS/rep.WindowS), len(out)-1)
		smp := &out[w]
		smp.OfferedPerS++
		if o.rejected {
			smp.Rejected.Add(o.code)
		} else {
			smp.AdmittedPerS++
		}
		if !o.done.IsZero() && !o.first.IsZero() {
			smp.Completed++
			t := o.first.Sub(o.arrival).Seconds()
			ttft[w] = append(ttft[w], t)
			if t <= cfg.SLO.TTFTS {
				within[w]++
			}
			if o.generated > 1 {
				tpot[w] = append(tpot[w], o.done.Sub(o.first).Seconds()/float64(o.generated-1))
			}
		}
		// Waiting at the end of each window from its arrival until it left the waiting set.
		leftW := len(out)
		if !o.left.IsZero() {
			leftW = int(o.left.Sub(Epoch).Seconds() / rep.WindowS)
		}
		for k := w; k < min(leftW, len(out)); k++ {
			out[k].Waiting++
		}
	}
	for w := range out {
		smp := &out[w]
		smp.T = Epoch.Add(config.Seconds(float64(w+1) * rep.WindowS))
		smp.Prefill, smp.Decode = p.Windows[w].Prefill, p.Windows[w].Decode
		smp.OfferedPerS /= rep.WindowS
		smp.AdmittedPerS /= rep.WindowS
		smp.Engines = []history.EngineSample{}
		smp.TTFT, smp.TPOT = PercentilesOf(ttft[w]), PercentilesOf(tpot[w])
		if n := len(ttft[w]); n > 0 {
			a := float64(within[w]) / float64(n)
			smp.Attainment = &a
		}
	}
	return out
}

// decisionLines are the decision records of a replay's log that moved an engine or would have
// (advisory): the ones the page marks on its split.
func decisionLines(log []byte) []json.RawMessage {
	out := []json.RawMessage{}
	err := decisionlog.Read(bytes.NewReader(log), func(l decisionlog.Line) error {
		if d := l.Decision; d != nil && (d.Outcome == decisionlog.OutcomeMoved || d.AdvisoryResult == decisionlog.WouldMove) {
			out = append(out, json.RawMessage(slices.Clone(l.Raw)))
		}
		return nil
	})
	if err != nil { // the replay's own log, written in memory by decisionlog.Log
		panic(fmt.Sprintf("sim: the replay's decision log does not read back: %v", err))
	}
	return out
}
