package enginesim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func TestParsePromptForms(t *testing.T) {
	tests := []struct {
		name   string
		kind   apiKind
		body   string
		tokens int
	}{
		{"string", kindCompletion, `{"model":"m","prompt":"hello world!"}`, 3},            // 12 bytes
		{"string rounds up", kindCompletion, `{"model":"m","prompt":"hello world!!"}`, 4}, // 13 bytes
		{"utf8 bytes", kindCompletion, `{"model":"m","prompt":"h\u00e9llo"}`, 2},          // 6 bytes
		{"escapes decoded", kindCompletion, `{"model":"m","prompt":"a\nb\tc\"d"}`, 2},     // 7 bytes
		{"empty string", kindCompletion, `{"model":"m","prompt":""}`, 0},                  //
		{"token ids", kindCompletion, `{"model":"m","prompt":[1,2,3,4,5]}`, 5},            //
		{"strings", kindCompletion, `{"model":"m","prompt":["abcd","abcde"]}`, 3},         // 1 + 2
		{"token id arrays", kindCompletion, `{"model":"m","prompt":[[1,2],[3]]}`, 3},      //
		{"chat string", kindChat, `{"model":"m","messages":[{"role":"user","content":"abcdefgh"}]}`, 6},
		{"chat parts", kindChat, `{"model":"m","messages":[{"role":"system","content":"You are"},` +
			`{"role":"user","content":[{"type":"text","text":"abcd"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"efgh"}]}]}`, 12},
		{"chat null content", kindChat, `{"model":"m","messages":[{"role":"assistant","content":null}]}`, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := parseRequest(tt.kind, []byte(tt.body))
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if r.promptTokens != tt.tokens {
				t.Errorf("prompt tokens = %d, want %d", r.promptTokens, tt.tokens)
			}
		})
	}
}

func TestParseLimits(t *testing.T) {
	tests := []struct {
		body string
		max  int
	}{
		{`{"model":"m","prompt":"x"}`, 0},
		{`{"model":"m","prompt":"x","max_tokens":null}`, 0},
		{`{"model":"m","prompt":"x","max_tokens":7}`, 7},
		{`{"model":"m","prompt":"x","max_completion_tokens":9}`, 9},
		{`{"model":"m","prompt":"x","max_tokens":7,"max_completion_tokens":9}`, 9},
	}
	for _, tt := range tests {
		r, err := parseRequest(kindCompletion, []byte(tt.body))
		if err != nil {
			t.Fatalf("%s: %v", tt.body, err)
		}
		if r.maxTokens != tt.max {
			t.Errorf("%s: max tokens %d, want %d", tt.body, r.maxTokens, tt.max)
		}
	}
}

func TestParseInvalid(t *testing.T) {
	tests := []struct {
		name, body string
		kind       apiKind
		mention    string
	}{
		{"not json", `{"model":`, kindCompletion, "JSON"},
		{"not an object", `[1,2]`, kindCompletion, ""},
		{"missing model", `{"prompt":"x"}`, kindCompletion, "model"},
		{"empty model", `{"model":"","prompt":"x"}`, kindCompletion, "model"},
		{"model wrong type", `{"model":3,"prompt":"x"}`, kindCompletion, "model"},
		{"missing prompt", `{"model":"m"}`, kindCompletion, "prompt"},
		{"null prompt", `{"model":"m","prompt":null}`, kindCompletion, "prompt"},
		{"prompt number", `{"model":"m","prompt":42}`, kindCompletion, "prompt"},
		{"prompt empty array", `{"model":"m","prompt":[]}`, kindCompletion, "prompt"},
		{"prompt mixed array", `{"model":"m","prompt":[1,"a"]}`, kindCompletion, "prompt"},
		{"max_tokens zero", `{"model":"m","prompt":"x","max_tokens":0}`, kindCompletion, "max_tokens"},
		{"max_tokens string", `{"model":"m","prompt":"x","max_tokens":"5"}`, kindCompletion, "max_tokens"},
		{"stream string", `{"model":"m","prompt":"x","stream":"yes"}`, kindCompletion, "stream"},
		{"missing messages", `{"model":"m","prompt":"x"}`, kindChat, "messages"},
		{"empty messages", `{"model":"m","messages":[]}`, kindChat, "messages"},
		{"message without role", `{"model":"m","messages":[{"content":"x"}]}`, kindChat, "role"},
		{"content number", `{"model":"m","messages":[{"role":"user","content":5}]}`, kindChat, "content"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseRequest(tt.kind, []byte(tt.body))
			if err == nil {
				t.Fatal("accepted")
			}
			if err.status != http.StatusBadRequest || err.code != "invalid_request" {
				t.Errorf("status %d code %q, want 400 invalid_request", err.status, err.code)
			}
			if !strings.Contains(err.message, tt.mention) {
				t.Errorf("message %q does not mention %q", err.message, tt.mention)
			}
		})
	}
}

func TestPrefillBody(t *testing.T) {
	in := `{"model":"m","prompt":"x","max_tokens":50,"max_completion_tokens":60,"stream":true,` +
		`"stream_options":{"include_usage":true},"temperature":0.5}`
	out, err := prefillBody([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	if m["max_tokens"] != 1.0 || m["stream"] != false || m["temperature"] != 0.5 || m["prompt"] != "x" {
		t.Errorf("prefill body %s", out)
	}
	if _, ok := m["max_completion_tokens"]; ok {
		t.Errorf("prefill body keeps max_completion_tokens: %s", out)
	}
	if _, ok := m["stream_options"]; ok {
		t.Errorf("prefill body keeps stream_options: %s", out)
	}
	if kv, _ := m["kv_transfer_params"].(map[string]any); kv["do_remote_decode"] != true {
		t.Errorf("prefill body kv_transfer_params = %v", m["kv_transfer_params"])
	}
}

func TestLengthDrawDeterministic(t *testing.T) {
	a, b, c := newLengthDraw(42, 20), newLengthDraw(42, 20), newLengthDraw(43, 20)
	differ, sum := false, 0
	const n = 2000
	for range n {
		x, y, z := a.next(), b.next(), c.next()
		if x != y {
			t.Fatalf("same seed drew %d and %d", x, y)
		}
		if x < 1 || x > 80 {
			t.Fatalf("draw %d outside [1, 80]", x)
		}
		differ = differ || x != z
		sum += x
	}
	if !differ {
		t.Error("seeds 42 and 43 drew the same sequence")
	}
	if mean := float64(sum) / n; mean < 17 || mean > 23 {
		t.Errorf("mean draw %.1f, want about 20", mean)
	}
}

func TestChunkerFramesAreJSON(t *testing.T) {
	for _, kind := range []apiKind{kindCompletion, kindChat} {
		c := newChunker(kind, "cmpl-1", 1700000000, `we"ird<model>`)
		for i := range 3 {
			frame := string(c.token(i))
			if !strings.HasPrefix(frame, "data: ") || !strings.HasSuffix(frame, "\n\n") {
				t.Fatalf("frame %q", frame)
			}
			var v map[string]any
			if err := json.Unmarshal([]byte(strings.TrimSpace(frame[len("data: "):])), &v); err != nil {
				t.Fatalf("frame %q: %v", frame, err)
			}
			if v["model"] != `we"ird<model>` {
				t.Errorf("model = %v", v["model"])
			}
		}
		final := string(c.final("length", 3, 4))
		first, rest, _ := strings.Cut(final, "\n\n")
		var v struct {
			Usage usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(first[len("data: "):]), &v); err != nil {
			t.Fatalf("final %q: %v", final, err)
		}
		if v.Usage != (usage{3, 4, 7}) || rest != "data: [DONE]\n\n" {
			t.Errorf("final %q", final)
		}
	}
}
