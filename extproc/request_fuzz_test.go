package extproc

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// fuzzOpts: one-token blocks, so that short inputs make prefix hashes too.
var fuzzOpts = ParseOptions{BlockTokens: 1, NonTextTokens: 7}

func FuzzParseRequest(f *testing.F) {
	for _, tc := range []struct {
		body string
		chat bool
	}{
		{`{"model":"m","prompt":"hello world!"}`, false},
		{`{"model":"m","prompt":["abcd","efgh"],"max_tokens":5,"stream":true}`, false},
		{`{"model":"m","prompt":[1,2,3,4,5,6]}`, false},
		{`{"model":"m","prompt":[[1,2],[3]],"max_completion_tokens":3}`, false},
		{`{"model":"m","prompt":"a\u00e9\ud83d\ude00\n\"\\"}`, false},
		{`{"model":"m","prompt":"","max_tokens":-3}`, false},
		{`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi there"}]}`, true},
		{`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"abcdefgh"},{"type":"image_url","image_url":{"url":"x"}}]}]}`, true},
		{`{"model":"m","messages":[{"content":"abcd","role":"user","content":"efgh"},{"role":"assistant","content":null}]}`, true},
		{`{"model":"m","messages":[{"role":"user","content":[{"text":"abcd","type":"text"}]}],"stream":false}`, true},
		{`{"model":"m","messages":[{"role":"user","content":5}]}`, true},
		{`{"model":"m","x":[{"a":[1,2.5e-3,true,false,null,"s"]}],"prompt":"p"}`, false},
		{`[1,2]`, false},
		{`{"model":"m"`, true},
		{"{\"model\":\"m\",\"prompt\":\"\xff\"}", false},
	} {
		f.Add([]byte(tc.body), tc.chat)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		r1, e1 := ParseRequest(body, chat, fuzzOpts)
		r2, e2 := ParseRequest(body, chat, fuzzOpts)
		if r1 != r2 || (e1 == nil) != (e2 == nil) || e1 != nil && *e1 != *e2 {
			t.Fatalf("not deterministic: %+v %v / %+v %v", r1, e1, r2, e2)
		}
		valid := json.Valid(body)
		if e1 != nil {
			if e1.Status != 400 || e1.Code != CodeInvalidRequest || e1.Message == "" {
				t.Fatalf("bad error %+v", e1)
			}
			if syntax := strings.HasPrefix(e1.Message, "body is not valid JSON"); syntax == valid {
				t.Fatalf("json.Valid=%v but %q", valid, e1.Message)
			}
		} else if !valid {
			t.Fatalf("accepted a body that is not valid JSON: %+v", r1)
		}
		if !valid {
			return
		}
		if hasDuplicateKeys(body) {
			return // encoding/json keeps only the last; ParseRequest checks every one
		}
		// A second implementation of the rules on top of encoding/json.
		want, werr := refParse(body, chat)
		if !utf8.Valid(body) && len(want.Model) > MaxModelBytes/3 {
			return // encoding/json turns each invalid byte into 3: the length limit is not comparable
		}
		if (werr == "") != (e1 == nil) {
			t.Fatalf("reference says %q, ParseRequest says %v (%+v)", werr, e1, r1)
		}
		if e1 != nil || !utf8.Valid(body) {
			return // encoding/json replaces invalid UTF-8: sizes differ
		}
		if r1.Model != want.Model || r1.Stream != want.Stream || r1.MaxTokens != want.MaxTokens ||
			r1.TextBytes != want.TextBytes || r1.FixedTokens != want.FixedTokens || r1.PromptTokens != want.PromptTokens {
			t.Fatalf("got  %+v\nwant %+v", r1, want)
		}
		if want.PrefixBlocks >= 0 && fmt.Sprint(r1.PrefixHashes()) != fmt.Sprint(want.PrefixHashes()) {
			t.Fatalf("prefix\ngot  %x\nwant %x", r1.PrefixHashes(), want.PrefixHashes())
		}
	})
}

// refParse applies ParseRequest's rules with encoding/json. It returns a Request with
// PrefixBlocks -1 when it cannot predict the prefix hashes, or a non-empty problem.
func refParse(body []byte, chat bool) (Request, string) {
	var r Request
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	var top any
	if err := d.Decode(&top); err != nil {
		return r, err.Error()
	}
	m, ok := top.(map[string]any)
	if !ok {
		return r, "not an object"
	}
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	switch v := m["model"].(type) {
	case nil:
		bad("missing model")
	case string:
		if v == "" {
			bad("empty model")
		}
		if len(v) > MaxModelBytes {
			bad("model too long")
		}
		r.Model = v
	default:
		bad("model type")
	}
	switch v := m["stream"].(type) {
	case nil:
	case bool:
		r.Stream = v
	default:
		bad("stream type")
	}
	positive := func(name string) int {
		switch v := m[name].(type) {
		case nil:
			return 0
		case json.Number:
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil || n <= 0 || n > math.MaxInt32 {
				bad("%s value", name)
			}
			return int(n)
		}
		bad("%s type", name)
		return 0
	}
	r.MaxTokens = positive("max_tokens")
	if n := positive("max_completion_tokens"); n > 0 {
		r.MaxTokens = n
	}
	tokenID := func(v any) bool {
		n, ok := v.(json.Number)
		if !ok {
			return false
		}
		x, err := strconv.ParseInt(string(n), 10, 64)
		if err != nil || x < 0 || x > math.MaxUint32 {
			return false
		}
		r.FixedTokens++
		return true
	}
	var stream []byte // the hashed text, as the Request documents it
	hashable := true
	if !chat {
		switch v := m["prompt"].(type) {
		case nil:
			bad("missing prompt")
		case string:
			if v == "" {
				bad("empty prompt")
			}
			r.TextBytes += len(v)
			stream = []byte(v)
		case []any:
			if len(v) == 0 {
				bad("empty prompt")
				break
			}
			for i, e := range v {
				switch first := v[0].(type) {
				case string:
					s, ok := e.(string)
					if !ok || s == "" {
						bad("prompt element")
					}
					r.TextBytes += len(s)
					if i == 0 {
						stream = []byte(first)
					}
				case json.Number:
					if !tokenID(e) {
						bad("token id")
					}
					if n, err := strconv.ParseInt(fmt.Sprint(e), 10, 64); err == nil {
						stream = binary.LittleEndian.AppendUint32(stream, uint32(n))
					}
				case []any:
					a, ok := e.([]any)
					if !ok || len(a) == 0 {
						bad("prompt element")
					}
					for _, id := range a {
						if !tokenID(id) {
							bad("token id")
						}
						if i == 0 {
							if n, err := strconv.ParseInt(fmt.Sprint(id), 10, 64); err == nil {
								stream = binary.LittleEndian.AppendUint32(stream, uint32(n))
							}
						}
					}
				default:
					bad("prompt element type")
				}
			}
		default:
			bad("prompt type")
		}
	} else {
		switch v := m["messages"].(type) {
		case nil:
			bad("missing messages")
		case []any:
			if len(v) == 0 {
				bad("empty messages")
			}
			for _, e := range v {
				msg, ok := e.(map[string]any)
				if !ok {
					bad("message type")
					continue
				}
				role, ok := msg["role"].(string)
				if !ok {
					bad("role")
				}
				switch c := msg["content"].(type) {
				case nil:
					if role != "assistant" {
						bad("content missing")
					}
				case string:
					r.TextBytes += len(c)
					stream = append(stream, c...)
				case []any:
					for _, pe := range c {
						part, ok := pe.(map[string]any)
						if !ok {
							bad("part type")
							continue
						}
						typ, ok := part["type"].(string)
						if !ok {
							bad("part type member")
						}
						text, hasText := part["text"]
						ts, isString := text.(string)
						if hasText && !isString {
							bad("text type")
						}
						if typ == "text" {
							if !hasText {
								bad("text missing")
							}
							r.TextBytes += len(ts)
							stream = append(stream, ts...)
						} else {
							r.FixedTokens += fuzzOpts.NonTextTokens
							hashable = false // the marker hashes the raw part
						}
					}
				default:
					bad("content type")
				}
				r.FixedTokens += MessageOverheadTokens
				stream = append(append(stream, roleMarker...), role...)
			}
		default:
			bad("messages type")
		}
	}
	if len(problems) > 0 {
		return r, strings.Join(problems, "; ")
	}
	r.PromptTokens = textTokens(r.TextBytes, DefaultBytesPerToken) + r.FixedTokens
	r.PrefixBlocks = -1
	if hashable {
		h := refPrefix(stream, 4*fuzzOpts.BlockTokens)
		r.PrefixBlocks = copy(r.Prefix[:], h)
	}
	return r, ""
}

// hasDuplicateKeys reports whether an object of the (valid) document repeats a key.
func hasDuplicateKeys(body []byte) bool {
	d := json.NewDecoder(bytes.NewReader(body))
	type frame struct {
		obj  bool
		keys map[string]bool
		key  bool // the next token of an object is a key
	}
	var stack []frame
	for {
		tok, err := d.Token()
		if err != nil {
			return false
		}
		if n := len(stack); n > 0 && stack[n-1].obj {
			top := &stack[n-1]
			if top.key {
				if k, ok := tok.(string); ok {
					if top.keys[k] {
						return true
					}
					top.keys[k] = true
					top.key = false
					continue
				}
			} else {
				top.key = true
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, frame{obj: true, keys: map[string]bool{}, key: true})
		case json.Delim('['):
			stack = append(stack, frame{})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			if n := len(stack); n > 0 && stack[n-1].obj {
				stack[n-1].key = true
			}
		}
	}
}
