// Package sim is `narwhal sim` (docs/sim.md): it replays a request trace or a synthetic
// workload through the real router and controller in event-driven virtual time, against
// enginesim's engine model, under several role policies side by side, and reports them.
package sim

import (
	"bufio"
	"cmp"
	"compress/gzip"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Request is one row of a trace.
type Request struct {
	ArrivalS     float64 // seconds from the trace start
	InputTokens  int
	OutputTokens int
	PrefixBlocks []int // 512-token prompt-prefix block ids, when the trace has them
}

// LoadTrace reads a trace CSV (gzipped when the name ends in .gz) with the header
// arrival_s,input_tokens,output_tokens[,prefix_blocks]. limit > 0 keeps the first limit rows.
func LoadTrace(path string, limit int) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		gz, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("trace %s: %w", path, err)
		}
		defer gz.Close()
		r = gz
	}
	reqs, err := ReadTrace(r, limit)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	return reqs, nil
}

// ReadTrace parses a trace CSV; see LoadTrace.
func ReadTrace(r io.Reader, limit int) ([]Request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	if !sc.Scan() {
		return nil, fmt.Errorf("empty trace")
	}
	header := strings.Split(strings.TrimSpace(sc.Text()), ",")
	if len(header) < 3 || header[0] != "arrival_s" || header[1] != "input_tokens" || header[2] != "output_tokens" {
		return nil, fmt.Errorf("line 1: header %q, want arrival_s,input_tokens,output_tokens[,prefix_blocks]", sc.Text())
	}
	var out []Request
	last := 0.0
	for line := 2; sc.Scan(); line++ {
		if limit > 0 && len(out) >= limit {
			break
		}
		fields := strings.Split(strings.TrimSpace(sc.Text()), ",")
		if len(fields) == 1 && fields[0] == "" {
			continue
		}
		if len(fields) < 3 || len(fields) > 4 {
			return nil, fmt.Errorf("line %d: %d fields, want 3 or 4", line, len(fields))
		}
		var q Request
		var err error
		if q.ArrivalS, err = strconv.ParseFloat(fields[0], 64); err != nil || q.ArrivalS < last {
			return nil, fmt.Errorf("line %d: arrival_s %q is not a number at or after %v", line, fields[0], last)
		}
		last = q.ArrivalS
		if q.InputTokens, err = strconv.Atoi(fields[1]); err != nil || q.InputTokens < 0 {
			return nil, fmt.Errorf("line %d: input_tokens %q is not a count", line, fields[1])
		}
		if q.OutputTokens, err = strconv.Atoi(fields[2]); err != nil || q.OutputTokens < 0 {
			return nil, fmt.Errorf("line %d: output_tokens %q is not a count", line, fields[2])
		}
		if len(fields) == 4 && fields[3] != "" {
			for _, b := range strings.Fields(fields[3]) {
				id, err := strconv.Atoi(b)
				if err != nil {
					return nil, fmt.Errorf("line %d: prefix block %q is not an id", line, b)
				}
				q.PrefixBlocks = append(q.PrefixBlocks, id)
			}
		}
		out = append(out, q)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// ScaleRate returns copies of a workload's requests and changes with time compressed by k (2:
// twice the rate): every arrival and change time divided by k.
func ScaleRate(reqs []Request, changes []Change, k float64) ([]Request, []Change) {
	rs := make([]Request, len(reqs))
	for i, q := range reqs {
		q.ArrivalS /= k
		rs[i] = q
	}
	var cs []Change
	if changes != nil {
		cs = make([]Change, len(changes))
		for i, c := range changes {
			c.AtS /= k
			cs[i] = c
		}
	}
	return rs, cs
}

// Spread spreads the requests of a trace whose arrivals are quantised to a grid of gridS
// seconds (the Mooncake conversation trace's 3 s slots): each slot's requests get seeded uniform
// arrivals within the slot, in their order. It returns the requests re-sorted by arrival.
func Spread(reqs []Request, gridS float64, seed int64) []Request {
	if gridS <= 0 {
		return reqs
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 0x737072656164)) // "spread"
	out := make([]Request, 0, len(reqs))
	for i := 0; i < len(reqs); {
		j := i
		for j < len(reqs) && reqs[j].ArrivalS == reqs[i].ArrivalS {
			j++
		}
		at := make([]float64, j-i)
		for k := range at {
			at[k] = reqs[i].ArrivalS + rng.Float64()*gridS
		}
		slices.Sort(at)
		for k := range at {
			q := reqs[i+k]
			q.ArrivalS = math.Round(at[k]*1000) / 1000
			out = append(out, q)
		}
		i = j
	}
	sortByArrival(out)
	return out
}

// sortByArrival sorts requests by arrival, stably.
func sortByArrival(reqs []Request) {
	slices.SortStableFunc(reqs, func(a, b Request) int { return cmp.Compare(a.ArrivalS, b.ArrivalS) })
}
