package enginesim

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
)

// observed is what one streaming client saw.
type observed struct {
	id                        uint64
	send, first, second, last time.Time
	tokens                    int
	err                       error
}

// streamOnce sends one streaming request and timestamps its token frames.
func streamOnce(client *http.Client, url, body string, start <-chan struct{}) (o observed) {
	<-start
	o.send = time.Now()
	resp, err := client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		o.err = err
		return o
	}
	defer resp.Body.Close()
	br := bufio.NewReaderSize(resp.Body, 4096)
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			if err != io.EOF {
				o.err = err
			}
			return o
		}
		data, ok := bytes.CutPrefix(line, []byte("data: "))
		if !ok {
			continue
		}
		now := time.Now()
		if bytes.HasPrefix(data, []byte("[DONE]")) || bytes.Contains(data, []byte(`"usage"`)) {
			continue
		}
		o.tokens++
		switch o.tokens {
		case 1:
			o.first = now
			if _, rest, ok := bytes.Cut(data, []byte(`"id":"cmpl-`)); ok {
				end := bytes.IndexByte(rest, '"')
				o.id, _ = strconv.ParseUint(string(rest[:max(end, 0)]), 10, 64)
			}
		case 2:
			o.second = now
		}
		o.last = now
	}
}

// percentile is the p-quantile (0..1) of xs, nearest rank.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[max(0, int(math.Ceil(p*float64(len(s))))-1)]
}

// BenchmarkStreams256 drives 256 concurrent streaming requests (512-token prompts, 128 output
// tokens) per iteration through an engine on the default profile over loopback HTTP, and
// compares what the clients observe with what the profile predicts for the same schedule:
//
//   - TTFT: in FIFO (prefill) order, the k-th prefill ideally ends at
//     max(arrival_k, end_{k-1}) + Prefill.Seconds(prompt); the error is the client's first-token
//     time minus that ideal end (so it includes HTTP and scheduling delays).
//   - TPOT: over tokens 2..N (all decode steps; the first interval holds other prompts'
//     prefills), the client's mean interval against the mean of StepSeconds(streams, KV) at
//     the batch size and KV tokens of the steps that produced those tokens.
func BenchmarkStreams256(b *testing.B) {
	const (
		streams = 256
		prompt  = 512 // tokens: 2048 bytes
		output  = 128
	)
	prof := config.DefaultProfile()
	e := New(Options{Profile: prof, NoiseSigma: 0, Model: "bench"})
	srv := httptest.NewServer(e)
	rec := &lockedRecorder{}
	e.loop.setTracer(rec)

	// One transport per stream, each with a warm keep-alive connection, so that the 256
	// requests reach the engine together.
	clients := make([]*http.Client, streams)
	transports := make([]*http.Transport, streams)
	for i := range clients {
		transports[i] = &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}
		clients[i] = &http.Client{Transport: transports[i]}
		resp, err := clients[i].Get(srv.URL + "/health")
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	defer func() {
		e.Close()
		srv.Close()
		for _, tr := range transports {
			tr.CloseIdleConnections()
		}
	}()
	body := fmt.Sprintf(`{"model":"bench","prompt":%q,"max_tokens":%d,"stream":true}`, strings.Repeat("a", 4*prompt), output)
	url := srv.URL + "/v1/completions"

	var ttftErrMS, tpotErrPct []float64
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := make(chan struct{})
		results := make([]observed, streams)
		var wg sync.WaitGroup
		for i := range streams {
			wg.Go(func() { results[i] = streamOnce(clients[i], url, body, start) })
		}
		close(start)
		wg.Wait()

		b.StopTimer()
		rec.mu.Lock()
		steps, jobs := rec.steps, rec.jobs
		rec.steps, rec.jobs = nil, nil
		rec.mu.Unlock()
		tt, tp := predictErrors(b, prof, results, steps, jobs)
		ttftErrMS, tpotErrPct = append(ttftErrMS, tt...), append(tpotErrPct, tp...)
		b.StartTimer()
	}
	b.StopTimer()
	signed := 0.0
	for _, x := range ttftErrMS {
		signed += x / float64(len(ttftErrMS))
	}
	b.Logf("%d requests; mean signed TTFT error %+.3f ms (positive: later than the profile)", len(ttftErrMS), signed)
	for i := range ttftErrMS {
		ttftErrMS[i] = math.Abs(ttftErrMS[i])
	}
	for i := range tpotErrPct {
		tpotErrPct[i] = math.Abs(tpotErrPct[i])
	}
	mean := 0.0
	for _, x := range tpotErrPct {
		mean += x / float64(len(tpotErrPct))
	}
	b.ReportMetric(percentile(ttftErrMS, 0.5), "ttft_err_p50_ms")
	b.ReportMetric(percentile(ttftErrMS, 0.99), "ttft_err_p99_ms")
	b.ReportMetric(mean, "tpot_err_mean_pct")
	b.ReportMetric(percentile(tpotErrPct, 0.99), "tpot_err_p99_pct")
}

// predictErrors returns, per request, the TTFT error (ms, observed minus predicted) and the
// relative error of the mean per-token interval (percent).
func predictErrors(b *testing.B, prof config.Profile, results []observed, steps []stepRecord, jobs []jobRecord) (ttft, tpot []float64) {
	byID := make(map[uint64]jobRecord, len(jobs))
	for _, j := range jobs {
		byID[j.id] = j
	}
	stepSecs := make(map[uint64]float64, len(steps))
	idealFirst := make(map[uint64]time.Time, len(jobs))
	var prevEnd time.Time
	for _, s := range steps {
		switch s.kind {
		case stepPrefill:
			secs := prof.Prefill.Seconds(s.promptTokens)
			stepSecs[s.seq] = secs
			j, ok := byID[s.jobID]
			if !ok {
				b.Fatalf("prefill of unknown job %d", s.jobID)
			}
			start := prevEnd
			if j.arrival.After(start) {
				start = j.arrival
			}
			prevEnd = start.Add(time.Duration(secs * float64(time.Second)))
			idealFirst[j.id] = prevEnd
		case stepDecode:
			stepSecs[s.seq] = prof.Decode.StepSeconds(s.streams, s.kvTokens)
		}
	}
	for _, o := range results {
		if o.err != nil {
			b.Fatalf("request %d: %v", o.id, o.err)
		}
		j, ok := byID[o.id]
		if !ok || o.tokens != j.output || j.state != jobFinished {
			b.Fatalf("request %d: %d tokens, job %+v", o.id, o.tokens, j)
		}
		ttft = append(ttft, float64(o.first.Sub(idealFirst[o.id]))/float64(time.Millisecond))
		var want float64
		for seq := j.secondStep + 1; seq <= j.lastStep; seq++ {
			want += stepSecs[seq]
		}
		n := float64(o.tokens - 2)
		got := o.last.Sub(o.second).Seconds() / n
		want /= n
		tpot = append(tpot, 100*(got-want)/want)
	}
	return ttft, tpot
}

// BenchmarkChunkToken measures encoding one token's SSE frame (no allocations expected).
func BenchmarkChunkToken(b *testing.B) {
	for _, kind := range []struct {
		name string
		kind apiKind
	}{{"completion", kindCompletion}, {"chat", kindChat}} {
		b.Run(kind.name, func(b *testing.B) {
			c := newChunker(kind.kind, "cmpl-123456", 1767225600, "llama-3.1-8b")
			b.SetBytes(int64(len(c.token(1))))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				_, _ = io.Discard.Write(c.token(i))
				i++
			}
		})
	}
}
