package extproc

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// observed is everything a ResponseObserver reports.
type observed struct {
	Events               int
	First, Done, UsageOK bool
	Prompt, Completion   int
}

func (o *ResponseObserver) result() observed {
	p, c, ok := o.Usage()
	return observed{Events: o.Events(), First: o.FirstToken(), Done: o.Done(), UsageOK: ok, Prompt: p, Completion: c}
}

// observe feeds body to a new observer in the chunks that cuts (increasing offsets) make.
func observe(body []byte, streaming *bool, cuts ...int) observed {
	var o ResponseObserver
	if streaming != nil {
		o.SetStreaming(*streaming)
	}
	prev := 0
	for _, c := range cuts {
		o.Write(body[prev:c])
		prev = c
	}
	o.Write(body[prev:])
	return o.result()
}

func readTestdata(t testing.TB, name string) []byte {
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var (
	yes = func() *bool { b := true; return &b }()
	no  = func() *bool { b := false; return &b }()
)

func TestResponseObserverRecorded(t *testing.T) {
	tests := []struct {
		file      string
		streaming *bool
		want      observed
	}{
		{"vllm_chat_stream.txt", nil, observed{Events: 12, First: true, Done: true, UsageOK: true, Prompt: 17, Completion: 12}},
		{"vllm_chat_stream.txt", yes, observed{Events: 12, First: true, Done: true, UsageOK: true, Prompt: 17, Completion: 12}},
		{"vllm_completion_stream.txt", nil, observed{Events: 5, First: true, Done: true, UsageOK: true, Prompt: 5, Completion: 5}},
		{"vllm_reasoning_tools_stream.txt", nil, observed{Events: 5, First: true, Done: true}},
		{"vllm_chat_response.json", nil, observed{Events: 1, First: true, Done: true, UsageOK: true, Prompt: 25, Completion: 8}},
		{"vllm_chat_response.json", no, observed{Events: 1, First: true, Done: true, UsageOK: true, Prompt: 25, Completion: 8}},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/%v", tc.file, tc.streaming != nil), func(t *testing.T) {
			body := readTestdata(t, tc.file)
			if got := observe(body, tc.streaming); got != tc.want {
				t.Fatalf("whole body: got %+v, want %+v", got, tc.want)
			}
			// Every split into two chunks, and splits into three around each point.
			for i := 0; i <= len(body); i++ {
				if got := observe(body, tc.streaming, i); got != tc.want {
					t.Fatalf("split at %d (%q|%q): got %+v, want %+v", i, body[max(0, i-10):i], body[i:min(len(body), i+10)], got, tc.want)
				}
			}
			for i := 0; i <= len(body); i++ {
				for _, d := range []int{1, 5} {
					if i+d > len(body) {
						continue
					}
					if got := observe(body, tc.streaming, i, i+d); got != tc.want {
						t.Fatalf("splits at %d, %d: got %+v, want %+v", i, i+d, got, tc.want)
					}
				}
			}
			// One byte at a time.
			cuts := make([]int, len(body))
			for i := range cuts {
				cuts[i] = i
			}
			if got := observe(body, tc.streaming, cuts...); got != tc.want {
				t.Fatalf("byte by byte: got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestResponseObserverProgress(t *testing.T) {
	body := readTestdata(t, "vllm_chat_stream.txt")
	var o ResponseObserver
	events := bytes.SplitAfter(body, []byte("\n\n"))
	o.Write(events[0]) // the role-only first chunk is no token
	if o.FirstToken() || o.Events() != 0 {
		t.Fatalf("after the role chunk: %+v", o.result())
	}
	o.Write(events[1][:20])
	if o.FirstToken() {
		t.Fatal("first token before its line ended")
	}
	o.Write(events[1][20:])
	if !o.FirstToken() || o.Events() != 1 || o.Done() {
		t.Fatalf("after the first token: %+v", o.result())
	}
	if _, _, ok := o.Usage(); ok {
		t.Fatal("usage before the usage chunk")
	}
	o.Reset()
	if o.result() != (observed{}) {
		t.Fatal("Reset")
	}
}

func TestResponseObserverCases(t *testing.T) {
	chunk := func(delta string) string {
		return `data: {"id":"x","choices":[{"index":0,"delta":` + delta + `,"finish_reason":null}]}` + "\n\n"
	}
	tests := []struct {
		name      string
		streaming *bool
		body      string
		want      observed
	}{
		{"empty", nil, ``, observed{}},
		{"blank lines", nil, "\n\r\n\r\n", observed{}},
		{"done only", nil, "data: [DONE]\n", observed{Done: true}},
		{"done without space", nil, "data:[DONE]\r\n", observed{Done: true}},
		{"done with trailing blanks", nil, "data: [DONE] \t\n", observed{Done: true}},
		{"done needs its line end", nil, "data: [DONE]", observed{}},
		{"not done", nil, "data: [DONE]x\ndata: [DON]\ndata: [done]\n", observed{}},
		{"content", nil, chunk(`{"content":"a"}`), observed{Events: 1, First: true}},
		{"empty content", nil, chunk(`{"content":""}`), observed{}},
		{"null content", nil, chunk(`{"content":null}`), observed{}},
		{"escaped content", nil, chunk(`{"content":"\n"}`), observed{Events: 1, First: true}},
		{"content in an unrelated object", nil, `data: {"x":{"delta":{"content":"a"}}}` + "\n", observed{}},
		{"text outside choices", nil, `data: {"text":"a","choices":[]}` + "\n", observed{}},
		{"completion text", nil, `data: {"choices":[{"text":"a"}]}` + "\n", observed{Events: 1, First: true}},
		{"second choice", nil, `data: {"choices":[{"text":""},{"text":"b"}]}` + "\n", observed{Events: 1, First: true}},
		{"two choices count once", nil, `data: {"choices":[{"text":"a"},{"text":"b"}]}` + "\n", observed{Events: 1, First: true}},
		{"usage", nil, `data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}` + "\n", observed{UsageOK: true, Prompt: 12, Completion: 3}},
		{"usage last wins", nil, `data: {"usage":{"prompt_tokens":1,"completion_tokens":1}}` + "\n" + `data: {"usage":{"prompt_tokens":2,"completion_tokens":5}}` + "\n" + `data: {"usage":null}` + "\n",
			observed{UsageOK: true, Prompt: 2, Completion: 5}},
		{"nested usage ignored", nil, `data: {"x":{"usage":{"prompt_tokens":1}}}` + "\n", observed{}},
		{"bad usage numbers", nil, `data: {"usage":{"prompt_tokens":-1,"completion_tokens":1.5}}` + "\n", observed{}},
		{"huge usage number", nil, `data: {"usage":{"prompt_tokens":99999999999999999999999}}` + "\n", observed{}},
		{"incomplete JSON is ignored", nil, `data: {"choices":[{"text":"a"}]` + "\n" + `data: {"choices":[{"text":"b"}]}` + "\n", observed{Events: 1, First: true}},
		{"a key that looks like a value", nil, `data: {"choices":[{"content":"text","x":"text"}]}` + "\n", observed{}},
		{"escaped key never matches", nil, `data: {"choices":[{"t\u0065xt":"a"}]}` + "\n", observed{}},
		{"long key", nil, `data: {"choices":[{"` + strings.Repeat("k", 100) + `":"a","text":"b"}]}` + "\n", observed{Events: 1, First: true}},
		{"deep nesting", nil, `data: {"choices":[{"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `,"text":"a"}]}` + "\n", observed{Events: 1, First: true}},
		{"deep objects", nil, `data: {"a":` + strings.Repeat(`{"b":`, 70) + "1" + strings.Repeat("}", 70) + `,"choices":[{"text":"a"}]}` + "\n", observed{Events: 1, First: true}},
		{"other fields", nil, "id: 1\nevent: x\nretry: 5\n: comment\ndatum: {}\n" + chunk(`{"content":"a"}`), observed{Events: 1, First: true}},
		{"lines after done still count", nil, "data: [DONE]\n" + chunk(`{"content":"a"}`), observed{Events: 1, First: true, Done: true}},
		{"CR line ends", nil, strings.ReplaceAll(chunk(`{"content":"a"}`)+"data: [DONE]\n", "\n", "\r"), observed{Events: 1, First: true, Done: true}},
		{"JSON body", nil, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`, observed{Events: 1, First: true, Done: true, UsageOK: true, Prompt: 3, Completion: 1}},
		{"JSON body with leading blanks", nil, " \n\t{\"choices\":[{\"text\":\"hi\"}]}", observed{Events: 1, First: true, Done: true}},
		{"JSON body, usage first", no, `{"usage":{"completion_tokens":4,"prompt_tokens":9},"choices":[{"text":""}]}`, observed{Done: true, UsageOK: true, Prompt: 9, Completion: 4}},
		{"JSON body incomplete", no, `{"choices":[{"text":"hi"}],"usage":{"prompt_tokens":3`, observed{}},
		{"JSON body, garbage after", no, `{"choices":[{"text":"hi"}]} {"usage":{"prompt_tokens":3}}`, observed{Events: 1, First: true, Done: true}},
		{"JSON error body", no, `{"object":"error","message":"bad","type":"BadRequestError","code":400}`, observed{Done: true}},
		{"SSE forced on JSON", yes, `{"choices":[{"text":"hi"}]}`, observed{}},
		{"garbage", nil, "\x00\xff}}]]::,,\"\"\\\\data: {{{{\n", observed{}},
		{"garbage in data", nil, "data: {]}\ndata: {\"choices\":[{\"text\":\"a\"}]]}\ndata: {\"a\" 1}\ndata: {:}\ndata: {\"a\":tru}\n", observed{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(tc.body)
			if got := observe(body, tc.streaming); got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			for i := 0; i <= len(body); i++ {
				if got := observe(body, tc.streaming, i); got != tc.want {
					t.Fatalf("split at %d: got %+v, want %+v", i, got, tc.want)
				}
			}
		})
	}
}

func TestResponseObserverGarbage(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte("data: [DONE]{}[]\":,\\\n\r \tchoicesdeltacontenttextusageprompt_tokens0123456789\x00\xff")
	for n := range 2000 {
		body := make([]byte, rng.IntN(300))
		for i := range body {
			body[i] = alphabet[rng.IntN(len(alphabet))]
		}
		want := observe(body, nil)
		for k := 0; k < 5; k++ {
			cuts := []int{}
			for c := rng.IntN(len(body) + 1); c < len(body); c += 1 + rng.IntN(20) {
				cuts = append(cuts, c)
			}
			if got := observe(body, nil, cuts...); got != want {
				t.Fatalf("case %d %q cuts %v: got %+v, want %+v", n, body, cuts, got, want)
			}
		}
	}
}

func TestResponseObserverAllocs(t *testing.T) {
	body := readTestdata(t, "vllm_chat_stream.txt")
	events := bytes.SplitAfter(body, []byte("\n\n"))
	n := testing.AllocsPerRun(100, func() {
		var o ResponseObserver
		for _, e := range events {
			o.Write(e)
		}
		for i := 0; i < len(body); i += 7 {
			o.Write(body[i:min(len(body), i+7)])
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

func BenchmarkObserveSSE(b *testing.B) {
	body := readTestdata(b, "vllm_chat_stream.txt")
	events := bytes.SplitAfter(body, []byte("\n\n"))
	events = events[:len(events)-1] // the last split is empty
	var o ResponseObserver
	b.SetBytes(int64(len(body)) / int64(len(events)))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i == len(events) {
			o.Reset()
			i = 0
		}
		o.Write(events[i]) // one chunk: one "data: {...}\n\n" event
		i++
	}
}

func FuzzResponseObserver(f *testing.F) {
	for _, name := range []string{"vllm_chat_stream.txt", "vllm_completion_stream.txt", "vllm_reasoning_tools_stream.txt", "vllm_chat_response.json"} {
		// Small seeds fuzz (and minimize) much faster: a few events of each recording.
		b := readTestdata(f, name)
		if len(b) > 300 {
			b = append(b[:150:150], b[len(b)-150:]...)
		}
		f.Add(b, uint64(1), uint8(0))
	}
	f.Add([]byte("data: {\"choices\":[{\"text\":\"a\"}],\"usage\":{\"prompt_tokens\":1}}\r\n\r\ndata: [DONE]\r\n"), uint64(2), uint8(1))
	f.Add([]byte(`{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`), uint64(3), uint8(2))
	f.Add([]byte("\x00\xff}}]]::,,\"\"\\\\data: {{{{\n"), uint64(4), uint8(0))
	f.Fuzz(func(t *testing.T, body []byte, seed uint64, mode uint8) {
		var streaming *bool
		switch mode % 3 {
		case 1:
			streaming = yes
		case 2:
			streaming = no
		}
		whole := observe(body, streaming)
		if whole.First != (whole.Events > 0) || whole.Events < 0 || whole.Prompt < 0 || whole.Completion < 0 ||
			!whole.UsageOK && (whole.Prompt != 0 || whole.Completion != 0) {
			t.Fatalf("inconsistent %+v", whole)
		}
		// Two different chunkings (the whole body aside) must agree.
		rng := rand.New(rand.NewPCG(seed, uint64(mode)))
		for range 2 {
			var cuts []int
			for c := rng.IntN(len(body) + 1); c < len(body); c += 1 + rng.IntN(1+rng.IntN(64)) {
				cuts = append(cuts, c)
			}
			if got := observe(body, streaming, cuts...); got != whole {
				t.Fatalf("cuts %v: got %+v, whole body %+v", cuts, got, whole)
			}
		}
	})
}
