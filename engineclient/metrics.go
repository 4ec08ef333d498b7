package engineclient

// Reading an engine's GET /metrics (docs/engine-metrics.md): vLLM's and SGLang's scheduler and
// KV-cache metrics, by a line scanner that looks only at the samples it wants. An engine's
// /metrics is mostly histograms (vLLM's runs to tens of kilobytes); Narwhal reads every engine
// every few seconds, so the scanner keeps no line and allocates nothing per sample.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
)

// Metrics is what an engine's /metrics says under vLLM's or SGLang's names, summed over the
// series of a name (a data-parallel engine reports one series per rank).
type Metrics struct {
	// Dialect is "vllm" or "sglang": whose names the engine uses.
	Dialect string
	// Running and Waiting are the requests the engine's scheduler runs and queues
	// (vllm:num_requests_running / _waiting; sglang:num_running_reqs / num_queue_reqs and, in
	// SGLang's P/D mode, its bootstrap and transfer queues).
	Running, Waiting float64
	// KVUsage is the share of the KV cache in use, 0..1, averaged over the series
	// (vllm:kv_cache_usage_perc, the older gpu_cache_usage_perc; sglang:token_usage).
	KVUsage    float64
	HasKVUsage bool
	// KVCapacity is the KV cache's size in tokens, 0 when the engine does not say:
	// num_gpu_blocks × block_size of vllm:cache_config_info, sglang:max_total_num_tokens.
	KVCapacity int
	// Finished is the requests the engine has finished, every finish reason
	// (vllm:request_success_total, sglang:num_requests_total): a prefill leg it served for
	// another engine counts as one.
	Finished    float64
	HasFinished bool
	// PromptTokens is the prompt tokens it has prefilled (vllm:prompt_tokens_total,
	// sglang:prompt_tokens_total).
	PromptTokens    float64
	HasPromptTokens bool
}

// ErrNoMetrics: the engine has no /metrics with vLLM's or SGLang's names.
var ErrNoMetrics = errors.New("no vLLM or SGLang metrics")

// MaxMetricsBytes bounds what one read of an engine's /metrics takes in: the rest is not read.
const MaxMetricsBytes = 8 << 20

// ScrapeMetrics reads GET url (an engine's /metrics).
func ScrapeMetrics(ctx context.Context, hc *http.Client, url string) (Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Metrics{}, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return Metrics{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return Metrics{}, fmt.Errorf("%w: GET %s answered %s", ErrNoMetrics, url, resp.Status)
	}
	return ParseMetrics(io.LimitReader(resp.Body, MaxMetricsBytes))
}

// The samples the scanner reads, by name.
const (
	sRunning = iota + 1
	sWaiting
	sKVUsage
	sKVUsageOld // vllm:gpu_cache_usage_perc, read when kv_cache_usage_perc is absent
	sCacheInfo
	sCapacity
	sFinished
	sPrompt
)

type wanted struct {
	what   uint8
	sglang bool
}

var wantedNames = map[string]wanted{
	"vllm:num_requests_running":  {sRunning, false},
	"vllm:num_requests_waiting":  {sWaiting, false},
	"vllm:kv_cache_usage_perc":   {sKVUsage, false},
	"vllm:gpu_cache_usage_perc":  {sKVUsageOld, false},
	"vllm:cache_config_info":     {sCacheInfo, false},
	"vllm:request_success_total": {sFinished, false},
	"vllm:prompt_tokens_total":   {sPrompt, false},

	"sglang:num_running_reqs":                {sRunning, true},
	"sglang:num_queue_reqs":                  {sWaiting, true},
	"sglang:num_prefill_prealloc_queue_reqs": {sWaiting, true},
	"sglang:num_prefill_inflight_queue_reqs": {sWaiting, true},
	"sglang:num_decode_prealloc_queue_reqs":  {sWaiting, true},
	"sglang:num_decode_transfer_queue_reqs":  {sWaiting, true},
	"sglang:token_usage":                     {sKVUsage, true},
	"sglang:max_total_num_tokens":            {sCapacity, true},
	"sglang:num_requests_total":              {sFinished, true},
	"sglang:prompt_tokens_total":             {sPrompt, true},
}

// ParseMetrics reads Prometheus text exposition for the samples Metrics holds. Lines it cannot
// read are skipped, as are samples whose value is not a finite number. It reports ErrNoMetrics
// when neither dialect's running-requests gauge is there.
func ParseMetrics(r io.Reader) (Metrics, error) {
	var (
		m    Metrics
		acc  metricsAcc
		br   = bufio.NewReaderSize(r, 16<<10)
		long bool // in the rest of a line longer than the buffer
	)
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			long = true // a line this long is no sample of ours
			continue
		case long:
			long = false
		default:
			acc.line(line)
		}
		if err != nil {
			if err != io.EOF && !errors.Is(err, bufio.ErrBufferFull) {
				return m, err
			}
			break
		}
	}
	return acc.result()
}

// metricsAcc accumulates the samples of one exposition.
type metricsAcc struct {
	seen         [sPrompt + 1]bool
	sum          [sPrompt + 1]float64
	n            [sPrompt + 1]int
	capacity     int
	sglang, vllm bool
}

// line reads one line of the exposition.
func (a *metricsAcc) line(line []byte) {
	line = bytes.TrimLeft(line, " \t")
	if len(line) == 0 || line[0] == '#' {
		return
	}
	end := 0 // the metric name: [a-zA-Z_:][a-zA-Z0-9_:]*
	for end < len(line) && nameByte(line[end], end > 0) {
		end++
	}
	if end == 0 {
		return
	}
	w, ok := wantedNames[string(line[:end])] // no allocation: the compiler reads the map with the bytes
	if !ok {
		return
	}
	rest := bytes.TrimLeft(line[end:], " \t")
	blocks, size := -1, -1
	if len(rest) > 0 && rest[0] == '{' {
		var ok bool
		if rest, ok = scanLabels(rest[1:], func(name, value []byte) {
			if w.what != sCacheInfo {
				return
			}
			switch string(name) {
			case "num_gpu_blocks":
				blocks = atoiLabel(value)
			case "block_size":
				size = atoiLabel(value)
			}
		}); !ok {
			return
		}
	}
	v, ok := sampleValue(rest)
	if !ok {
		return
	}
	a.add(w, v, blocks, size)
}

// add counts one sample of a wanted name (blocks and size: the cache config's labels, -1 when
// absent or not numbers).
func (a *metricsAcc) add(w wanted, v float64, blocks, size int) {
	if w.sglang {
		a.sglang = true
	} else {
		a.vllm = true
	}
	switch w.what {
	case sCacheInfo:
		if blocks > 0 && size > 0 {
			a.capacity = max(a.capacity, blocks*size)
		}
	case sCapacity:
		a.capacity = max(a.capacity, int(v))
	}
	a.seen[w.what] = true
	a.sum[w.what] += v
	a.n[w.what]++
}

// result turns the accumulated samples into Metrics.
func (a *metricsAcc) result() (Metrics, error) {
	var m Metrics
	if !a.seen[sRunning] {
		return m, ErrNoMetrics
	}
	m.Dialect = "vllm"
	if a.sglang && !a.vllm {
		m.Dialect = "sglang"
	}
	m.Running, m.Waiting = a.sum[sRunning], a.sum[sWaiting]
	for _, k := range []int{sKVUsage, sKVUsageOld} {
		if a.seen[k] {
			m.KVUsage, m.HasKVUsage = a.sum[k]/float64(a.n[k]), true
			break
		}
	}
	m.KVCapacity = a.capacity
	m.Finished, m.HasFinished = a.sum[sFinished], a.seen[sFinished]
	m.PromptTokens, m.HasPromptTokens = a.sum[sPrompt], a.seen[sPrompt]
	return m, nil
}

// scanLabels reads a label set after its '{' up to and past its '}', calling fn with each
// label's name and raw value (escapes left as they are). ok is false when it is malformed.
func scanLabels(b []byte, fn func(name, value []byte)) (rest []byte, ok bool) {
	for {
		b = bytes.TrimLeft(b, " \t")
		if len(b) == 0 {
			return nil, false
		}
		if b[0] == '}' {
			return b[1:], true
		}
		eq := bytes.IndexByte(b, '=')
		if eq <= 0 {
			return nil, false
		}
		name := bytes.TrimRight(b[:eq], " \t")
		b = bytes.TrimLeft(b[eq+1:], " \t")
		if len(b) == 0 || b[0] != '"' {
			return nil, false
		}
		i := 1
		for ; i < len(b) && b[i] != '"'; i++ {
			if b[i] == '\\' {
				i++
			}
		}
		if i >= len(b) {
			return nil, false
		}
		fn(name, b[1:i])
		b = bytes.TrimLeft(b[i+1:], " \t")
		if len(b) > 0 && b[0] == ',' {
			b = b[1:]
		}
	}
}

// sampleValue reads the value after a sample's name and labels (a timestamp may follow).
func sampleValue(b []byte) (float64, bool) {
	b = bytes.TrimLeft(b, " \t")
	end := bytes.IndexAny(b, " \t\r\n")
	if end < 0 {
		end = len(b)
	}
	if end == 0 {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(b[:end]), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

func nameByte(c byte, digits bool) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == ':' || digits && c >= '0' && c <= '9'
}

func atoiLabel(b []byte) int {
	n, err := strconv.Atoi(string(b))
	if err != nil {
		return -1
	}
	return n
}
