package extproc

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/narwhal-llm/narwhal/config"
)

func sizingBytes() config.Sizing {
	return config.Sizing{Method: config.SizingBytes, Encoding: "cl100k_base", NonTextTokens: 576}
}

func sizingBPE() config.Sizing {
	return config.Sizing{Method: config.SizingBPE, Encoding: "cl100k_base", NonTextTokens: 576}
}

// bpeSizer is built once: loading a vocabulary takes a moment.
var bpeSizer = sync.OnceValues(func() (*Sizer, error) { return NewSizer(sizingBPE()) })

// observedModels names the models tests observe on the shared Sizer, one per run.
var observedModels atomic.Int64

func TestNewSizer(t *testing.T) {
	if _, err := NewSizer(config.Sizing{Method: "words"}); !errors.Is(err, ErrSizingMethod) {
		t.Fatalf("unknown method: %v", err)
	}
	if _, err := NewSizer(config.Sizing{Method: config.SizingBPE, Encoding: "gpt9"}); err == nil {
		t.Fatal("unknown encoding accepted")
	}
	for _, m := range []string{"", config.SizingBytes} {
		s, err := NewSizer(config.Sizing{Method: m})
		if err != nil || s.Method() != config.SizingBytes {
			t.Fatalf("method %q: %v %v", m, s, err)
		}
	}
	s, err := bpeSizer()
	if err != nil || s.Method() != config.SizingBPE {
		t.Fatalf("bpe: %v", err)
	}
}

func TestSizerBPECounts(t *testing.T) {
	s, err := bpeSizer()
	if err != nil {
		t.Fatal(err)
	}
	opts := ParseOptions{Sizer: s, NonTextTokens: 10}
	tests := []struct {
		name   string
		chat   bool
		body   string
		tokens int
	}{
		{"hello world", false, `{"model":"m","prompt":"hello world"}`, 2},
		{"escapes are decoded first", false, `{"model":"m","prompt":"hello\u0020world"}`, 2},
		{"a sentence", false, `{"model":"m","prompt":"The quick brown fox jumps over the lazy dog."}`, 10},
		{"batch", false, `{"model":"m","prompt":["hello world","hello world"]}`, 4},
		{"token ids are counted by length", false, `{"model":"m","prompt":[9906,1917,0]}`, 3},
		{"chat", true, `{"model":"m","messages":[{"role":"user","content":"hello world"},{"role":"user","content":[{"type":"text","text":"hello world"},{"type":"image_url","image_url":{"url":"u"}}]}]}`,
			2 + 4 + 2 + 10 + 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, rerr := ParseRequest([]byte(tc.body), tc.chat, opts)
			if rerr != nil {
				t.Fatal(rerr)
			}
			if r.PromptTokens != tc.tokens {
				t.Fatalf("tokens %d, want %d", r.PromptTokens, tc.tokens)
			}
		})
	}
	// Observations do not change a BPE count, but they are tracked. The Sizer is shared by the
	// tests (and by -count runs): observe a model of this run alone.
	model := fmt.Sprintf("obs-%d", observedModels.Add(1))
	body := []byte(`{"model":"` + model + `","prompt":"hello world"}`)
	r, _ := ParseRequest(body, false, opts)
	s.ObserveRequest(&r, 3)
	var e []SizingError
	for _, x := range s.Errors() {
		if x.Model == model {
			e = append(e, x)
		}
	}
	if len(e) != 1 || e[0].Samples != 1 || e[0].BytesPerToken != 0 || math.Abs(e[0].Bias-(-1.0/3)) > 1e-9 {
		t.Fatalf("errors %+v", e)
	}
	if r2, _ := ParseRequest(body, false, opts); r2.PromptTokens != 2 {
		t.Fatalf("tokens %d after an observation", r2.PromptTokens)
	}
}

func TestSizerCalibration(t *testing.T) {
	s, err := NewSizer(sizingBytes())
	if err != nil {
		t.Fatal(err)
	}
	if got := s.BytesPerToken("m"); got != DefaultBytesPerToken {
		t.Fatalf("initial ratio %v", got)
	}
	// The model's text really is 3 bytes a token; chat overhead is known exactly.
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("abc ", 300) + `"}]}`)
	opts := ParseOptions{Sizer: s}
	truth := 1200/3 + MessageOverheadTokens
	var first SizingError
	for i := range 100 {
		r, rerr := ParseRequest(body, true, opts)
		if rerr != nil {
			t.Fatal(rerr)
		}
		s.ObserveRequest(&r, truth)
		if i == 0 {
			first = s.Errors()[0]
			if first.Samples != 1 || math.Abs(first.Bias-(-0.25)) > 0.01 || math.Abs(first.MAPE-0.25) > 0.01 {
				t.Fatalf("first sample: %+v", first)
			}
		}
	}
	e := s.Errors()
	if len(e) != 1 || e[0].Model != "m" || e[0].Samples != 100 {
		t.Fatalf("errors %+v", e)
	}
	if math.Abs(e[0].BytesPerToken-3) > 0.05 {
		t.Fatalf("ratio %v, want about 3", e[0].BytesPerToken)
	}
	if e[0].MAPE >= first.MAPE/2 || e[0].Bias <= first.Bias {
		t.Fatalf("errors did not shrink: first %+v, now %+v", first, e[0])
	}
	r, _ := ParseRequest(body, true, opts)
	if math.Abs(float64(r.PromptTokens-truth)) > 0.02*float64(truth) {
		t.Fatalf("calibrated estimate %d, truth %d", r.PromptTokens, truth)
	}
	// The ratio moves toward a new truth and stays within bounds.
	for range 300 {
		s.Observe("m", 100, 1000) // absurdly many tokens
	}
	if got := s.BytesPerToken("m"); got < MinBytesPerToken || got > MinBytesPerToken*1.02 {
		t.Fatalf("ratio %v, want the lower bound", got)
	}
	for range 300 {
		s.Observe("m", 1000, 10)
	}
	if got := s.BytesPerToken("m"); got > MaxBytesPerToken || got < MaxBytesPerToken*0.98 {
		t.Fatalf("ratio %v, want the upper bound", got)
	}
}

func TestSizerObserveNumbersOnly(t *testing.T) {
	s, _ := NewSizer(sizingBytes())
	for range 200 {
		// 400 bytes of text at 2 bytes a token, estimated at the current ratio.
		s.Observe("m", textTokens(400, s.BytesPerToken("m")), 200)
	}
	if got := s.BytesPerToken("m"); math.Abs(got-2) > 0.05 {
		t.Fatalf("ratio %v", got)
	}
	s.Observe("m", 10, 0) // ignored
	s.Observe("m", -1, 5)
	if e := s.Errors(); e[0].Samples != 200 {
		t.Fatalf("samples %d", e[0].Samples)
	}
	// Small texts and fixed-only prompts do not move the ratio.
	s2, _ := NewSizer(sizingBytes())
	s2.ObserveRequest(&Request{Model: "m", TextBytes: 10, PromptTokens: 3}, 10)
	s2.ObserveRequest(&Request{Model: "m", FixedTokens: 100, PromptTokens: 100}, 100)
	if got := s2.BytesPerToken("m"); got != DefaultBytesPerToken {
		t.Fatalf("ratio %v", got)
	}
	if e := s2.Errors(); e[0].Samples != 2 {
		t.Fatalf("%+v", e)
	}
}

// The sizing table is bounded: past MaxTrackedModels, a new model evicts the least recently
// used one, and a model in use keeps its calibration (issue 7).
func TestSizerModelCap(t *testing.T) {
	s, _ := NewSizer(sizingBytes())
	for range 200 { // "busy" calibrates to 2 bytes per token
		s.Observe("busy", textTokens(400, s.BytesPerToken("busy")), 200)
	}
	for i := range 10 * MaxTrackedModels {
		s.Observe(fmt.Sprintf("m%04d", i), 100, 100)
		if i%8 == 0 {
			_ = s.BytesPerToken("busy") // in use all along
		}
	}
	e := s.Errors()
	if len(e) != MaxTrackedModels {
		t.Fatalf("%d entries, want %d", len(e), MaxTrackedModels)
	}
	for i := 1; i < len(e); i++ {
		if e[i-1].Model >= e[i].Model {
			t.Fatalf("not sorted at %d: %q %q", i, e[i-1].Model, e[i].Model)
		}
	}
	if r := s.BytesPerToken("busy"); math.Abs(r-2) > 0.1 {
		t.Fatalf("the model in use lost its calibration: %v", r)
	}
	if e[len(e)-1].Model != fmt.Sprintf("m%04d", 10*MaxTrackedModels-1) {
		t.Fatalf("the newest model is not tracked: %+v", e[len(e)-1])
	}
	if s.BytesPerToken("m0001") != DefaultBytesPerToken {
		t.Fatal("an evicted model kept a ratio")
	}
}

func TestSizerConcurrent(t *testing.T) {
	s, _ := NewSizer(sizingBytes())
	body := []byte(`{"model":"m1","prompt":"` + strings.Repeat("abcd", 100) + `"}`)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				model := fmt.Sprintf("m%d", (g+i)%8)
				r, _ := ParseRequest(body, false, ParseOptions{Sizer: s})
				s.ObserveRequest(&r, 150)
				s.Observe(model, 100, 90)
				if i%50 == 0 {
					s.Errors()
				}
			}
		}()
	}
	wg.Wait()
	total := int64(0)
	for _, e := range s.Errors() {
		total += e.Samples
	}
	if total != 4*500*2 {
		t.Fatalf("samples %d", total)
	}
}

func TestSizerBPEConcurrent(t *testing.T) {
	s, err := bpeSizer()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				r, _ := ParseRequest([]byte(`{"model":"x","prompt":"hello world"}`), false, ParseOptions{Sizer: s})
				if r.PromptTokens != 2 {
					t.Errorf("tokens %d", r.PromptTokens)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func BenchmarkSizing(b *testing.B) {
	bodies := benchBodies()
	bpe, err := bpeSizer()
	if err != nil {
		b.Fatal(err)
	}
	bytes, _ := NewSizer(sizingBytes())
	for _, tc := range bodies[:2] {
		r, _ := ParseRequest(tc.body, tc.chat, ParseOptions{})
		bytes.ObserveRequest(&r, r.PromptTokens) // intern the model
	}
	for _, m := range []struct {
		name string
		s    *Sizer
	}{{"bytes", bytes}, {"bpe", bpe}} {
		for _, tc := range bodies[:2] {
			b.Run(m.name+"/"+tc.name, func(b *testing.B) {
				opts := ParseOptions{BlockTokens: 64, NonTextTokens: 576, Sizer: m.s}
				b.SetBytes(int64(len(tc.body)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := ParseRequest(tc.body, tc.chat, opts); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
	b.Run("observe", func(b *testing.B) {
		r, _ := ParseRequest(bodies[0].body, true, ParseOptions{Sizer: bytes})
		b.ReportAllocs()
		for b.Loop() {
			bytes.ObserveRequest(&r, 600)
		}
	})
}
