package extproc

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/tiktoken-go/tokenizer"

	"github.com/narwhal-llm/narwhal/config"
)

// Sizing constants of the bytes method.
const (
	// DefaultBytesPerToken is the bytes-per-token ratio of a model before any calibration.
	DefaultBytesPerToken = 4.0
	// MinBytesPerToken and MaxBytesPerToken bound the calibrated ratio.
	MinBytesPerToken = 1.0
	MaxBytesPerToken = 16.0
	// MaxTrackedModels is how many models keep their own calibration and error statistics.
	// Model names are client-chosen (at most MaxModelBytes each): when a new model is observed
	// with the table full, the least recently used model leaves it.
	MaxTrackedModels = 64

	// calibration: each observation decays the previous sums by calibrationDecay (an
	// effective memory of about 50 responses); an observation weighs at most
	// calibrationMaxBytes of text, and one with less than calibrationMinBytes is ignored. The
	// starting ratio weighs as much as calibrationPriorBytes of text.
	calibrationDecay      = 0.98
	calibrationMaxBytes   = 64 << 10
	calibrationMinBytes   = 64
	calibrationPriorBytes = 1024
	// errorWindow: the error statistics are exact means over the first errorWindow samples,
	// then exponentially weighted means over about the last errorWindow.
	errorWindow = 256
)

// ErrSizingMethod is returned by NewSizer for an unknown method.
var ErrSizingMethod = errors.New("extproc: unknown sizing method")

// Sizer sizes prompts locally (router.sizing) and tracks how far its sizes are from the
// engines' usage.prompt_tokens. Method bytes estimates text tokens as bytes / ratio, with a
// ratio per model calibrated online from observed usage; method bpe counts them exactly with
// an embedded BPE vocabulary. Token-id prompts, message overheads and non-text parts are sized
// by ParseRequest alike for both (see Request.FixedTokens).
//
// A Sizer is safe for concurrent use. Sizing a request reads an atomically published model
// table and an atomic ratio, with no lock; Observe locks only the observed model's entry.
// Recency for the table's LRU is an epoch that advances on every addition: a lookup stamps
// its entry with the current epoch (a write only when the stamp changes), and an addition to a
// full table evicts an entry with the oldest stamp, one not used since the earliest addition.
type Sizer struct {
	codec tokenizer.Codec // nil for method bytes

	mu     sync.Mutex                             // serializes additions to models
	models atomic.Pointer[map[string]*modelStats] // copy-on-write: readers never lock
	epoch  atomic.Uint64
}

// modelStats is one model's calibration and sizing error.
type modelStats struct {
	name  string
	ratio atomic.Uint64 // math.Float64bits of the bytes-per-token ratio
	used  atomic.Uint64 // the Sizer's epoch when last used

	mu            sync.Mutex
	bytes, tokens float64 // decayed sums of calibration text bytes and tokens
	samples       int64
	mape, bias    float64
}

func newModelStats(name string) *modelStats {
	e := &modelStats{name: name, bytes: calibrationPriorBytes,
		tokens: calibrationPriorBytes / DefaultBytesPerToken}
	e.ratio.Store(math.Float64bits(DefaultBytesPerToken))
	return e
}

// NewSizer returns a Sizer for cfg. Method bpe loads the embedded vocabulary named by
// cfg.Encoding (cl100k_base when empty), which takes a moment and some memory; nothing is
// downloaded.
func NewSizer(cfg config.Sizing) (*Sizer, error) {
	s := &Sizer{}
	s.models.Store(&map[string]*modelStats{})
	switch cfg.Method {
	case "", config.SizingBytes:
	case config.SizingBPE:
		enc := cfg.Encoding
		if enc == "" {
			enc = string(tokenizer.Cl100kBase)
		}
		c, err := tokenizer.Get(tokenizer.Encoding(enc))
		if err != nil {
			return nil, fmt.Errorf("extproc: bpe encoding %q: %w", enc, err)
		}
		s.codec = c
	default:
		return nil, fmt.Errorf("%w %q", ErrSizingMethod, cfg.Method)
	}
	return s, nil
}

// Method returns config.SizingBytes or config.SizingBPE.
func (s *Sizer) Method() string {
	if s != nil && s.codec != nil {
		return config.SizingBPE
	}
	return config.SizingBytes
}

// BytesPerToken returns the ratio the bytes method uses for model now.
func (s *Sizer) BytesPerToken(model string) float64 {
	return s.stats(model).bytesPerToken()
}

// countBPE counts the tokens of one piece of text with the BPE codec.
func (s *Sizer) countBPE(text []byte) int {
	n, err := s.codec.Count(string(text))
	if err != nil { // only on a regexp engine failure: fall back to an estimate
		return textTokens(len(text), DefaultBytesPerToken)
	}
	return n
}

// lookup returns the entry of the model named by name, or nil when it has none. It neither
// locks nor allocates.
func (s *Sizer) lookup(name []byte) *modelStats {
	if s == nil {
		return nil
	}
	return s.touch((*s.models.Load())[string(name)])
}

func (s *Sizer) stats(model string) *modelStats {
	if s == nil {
		return nil
	}
	return s.touch((*s.models.Load())[model])
}

// touch stamps an entry with the current epoch (LRU recency).
func (s *Sizer) touch(e *modelStats) *modelStats {
	if e != nil {
		if ep := s.epoch.Load(); e.used.Load() != ep {
			e.used.Store(ep)
		}
	}
	return e
}

// entry returns the entry of model, adding it (and evicting the least recently used entry of a
// full table) when it has none.
func (s *Sizer) entry(model string) *modelStats {
	if e := s.stats(model); e != nil {
		return e
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.models.Load()
	if e, ok := old[model]; ok {
		return e
	}
	var evict string
	if len(old) >= MaxTrackedModels {
		oldest := uint64(math.MaxUint64)
		for k, v := range old {
			if u := v.used.Load(); u < oldest || u == oldest && k < evict {
				oldest, evict = u, k
			}
		}
	}
	m := make(map[string]*modelStats, len(old)+1)
	for k, v := range old {
		if k != evict || len(old) < MaxTrackedModels {
			m[k] = v
		}
	}
	e := newModelStats(model)
	e.used.Store(s.epoch.Add(1))
	m[model] = e
	s.models.Store(&m)
	return e
}

func (e *modelStats) bytesPerToken() float64 {
	if e == nil {
		return DefaultBytesPerToken
	}
	return math.Float64frombits(e.ratio.Load())
}

// Observe records the truth of one response: the engine counted actual prompt tokens where
// the Sizer estimated estimated. It updates model's error statistics and, for method bytes,
// its ratio, taking the whole estimate as text sized at the current ratio. ObserveRequest is
// more precise when the Request is at hand. A non-positive actual is ignored, and so is any
// observation by a nil Sizer.
func (s *Sizer) Observe(model string, estimated, actual int) {
	if s == nil || actual <= 0 || estimated < 0 {
		return
	}
	e := s.entry(model)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.record(estimated, actual)
	if s.codec == nil {
		e.calibrate(float64(estimated)*e.bytesPerToken(), float64(actual))
	}
}

// ObserveRequest is Observe for a request sized by ParseRequest: the calibration (method
// bytes) compares only the request's text with the tokens that are not FixedTokens.
func (s *Sizer) ObserveRequest(r *Request, actual int) {
	if s == nil || actual <= 0 {
		return
	}
	e := s.entry(r.Model)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.record(r.PromptTokens, actual)
	if text := actual - r.FixedTokens; s.codec == nil && text > 0 {
		e.calibrate(float64(r.TextBytes), float64(text))
	}
}

// record updates the error statistics; e.mu is held.
func (e *modelStats) record(estimated, actual int) {
	rel := float64(estimated-actual) / float64(actual)
	e.samples++
	a := max(1/float64(e.samples), 1.0/errorWindow)
	e.mape += a * (math.Abs(rel) - e.mape)
	e.bias += a * (rel - e.bias)
}

// calibrate adds one observation of text bytes sized tokens; e.mu is held.
func (e *modelStats) calibrate(bytes, tokens float64) {
	if bytes < calibrationMinBytes || tokens <= 0 {
		return
	}
	tokens = min(max(tokens, bytes/MaxBytesPerToken), bytes/MinBytesPerToken)
	if bytes > calibrationMaxBytes {
		tokens *= calibrationMaxBytes / bytes
		bytes = calibrationMaxBytes
	}
	e.bytes = calibrationDecay*e.bytes + bytes
	e.tokens = calibrationDecay*e.tokens + tokens
	r := min(max(e.bytes/e.tokens, MinBytesPerToken), MaxBytesPerToken)
	e.ratio.Store(math.Float64bits(r))
}

// SizingError is one model's sizing accuracy. Errors are relative to the engine's count:
// (estimated - actual) / actual.
type SizingError struct {
	Model   string
	Samples int64
	// MAPE is the mean absolute relative error (0.1 = 10%), Bias the mean signed one
	// (positive: the Sizer overestimates). Both are exact means over the first 256 samples,
	// then exponentially weighted over about the last 256.
	MAPE, Bias float64
	// BytesPerToken is the current ratio of method bytes (0 for method bpe).
	BytesPerToken float64
}

// Errors returns the sizing accuracy of every tracked model (at most MaxTrackedModels), sorted
// by model name.
func (s *Sizer) Errors() []SizingError {
	if s == nil {
		return nil
	}
	m := *s.models.Load()
	out := make([]SizingError, 0, len(m)+1)
	for _, e := range m {
		e.mu.Lock()
		se := SizingError{Model: e.name, Samples: e.samples, MAPE: e.mape, Bias: e.bias}
		e.mu.Unlock()
		if s.codec == nil {
			se.BytesPerToken = e.bytesPerToken()
		}
		if se.Samples > 0 {
			out = append(out, se)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out
}
