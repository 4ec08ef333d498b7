package extproc

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

func TestParseRequestForms(t *testing.T) {
	opts := ParseOptions{NonTextTokens: 100}
	tests := []struct {
		name      string
		chat      bool
		body      string
		model     string
		stream    bool
		maxTokens int
		tokens    int // at DefaultBytesPerToken
		textBytes int
		fixed     int
	}{
		{name: "string prompt", body: `{"model":"m","prompt":"hello world!"}`,
			model: "m", tokens: 3, textBytes: 12},
		{name: "string prompt rounds", body: `{"model":"m","prompt":"hello world!xy"}`,
			model: "m", tokens: 4, textBytes: 14}, // 3.5 rounds up
		{name: "short text is one token", body: `{"model":"m","prompt":"a"}`,
			model: "m", tokens: 1, textBytes: 1},
		{name: "escapes are decoded", body: `{"model":"m","prompt":"a\nb\u00e9\ud83d\ude00\"\\\/"}`,
			model: "m", tokens: 3, textBytes: 1 + 1 + 1 + 2 + 4 + 3},
		{name: "lone surrogate is U+FFFD", body: `{"model":"m","prompt":"\ud800x"}`,
			model: "m", tokens: 1, textBytes: 4},
		{name: "array of strings", body: `{"model":"m","prompt":["abcd","efghijkl"]}`,
			model: "m", tokens: 3, textBytes: 12},
		{name: "array of token ids", body: `{"model":"m","prompt":[1, 2, 3, 4294967295]}`,
			model: "m", tokens: 4, fixed: 4},
		{name: "array of arrays of token ids", body: `{"model":"m","prompt":[[1,2],[3]]}`,
			model: "m", tokens: 3, fixed: 3},
		{name: "all fields", body: `{"stream":true,"max_tokens":7,"model":"llama","prompt":"abcdefgh","temperature":0.5,"stop":["\n"],"logit_bias":{"1":-100}}`,
			model: "llama", stream: true, maxTokens: 7, tokens: 2, textBytes: 8},
		{name: "chat string content", chat: true, body: `{"model":"m","messages":[{"role":"user","content":"abcdefgh"}]}`,
			model: "m", tokens: 2 + 4, textBytes: 8, fixed: 4},
		{name: "chat content parts", chat: true,
			body:  `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"abcd"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"input_audio","input_audio":{"data":"AA","format":"wav"}}]}]}`,
			model: "m", tokens: 1 + 100 + 100 + 4, textBytes: 4, fixed: 204},
		{name: "chat text part with text first", chat: true,
			body:  `{"model":"m","messages":[{"role":"user","content":[{"text":"abcdefgh","type":"text"}]}]}`,
			model: "m", tokens: 2 + 4, textBytes: 8, fixed: 4},
		{name: "chat multiple messages", chat: true,
			body:  `{"model":"m","messages":[{"role":"system","content":"be brief"},{"content":"abcd","role":"user"},{"role":"assistant","content":null,"tool_calls":[]},{"role":"tool","content":"ok"}],"max_completion_tokens":9}`,
			model: "m", maxTokens: 9, tokens: 4 + 4*4, textBytes: 14, fixed: 16},
		{name: "chat empty content string and empty parts", chat: true,
			body:  `{"model":"m","messages":[{"role":"user","content":""},{"role":"user","content":[]}]}`,
			model: "m", tokens: 8, fixed: 8},
		{name: "chat ignores prompt", chat: true, body: `{"model":"m","prompt":5,"messages":[{"role":"user","content":"abcd"}]}`,
			model: "m", tokens: 5, textBytes: 4, fixed: 4},
		{name: "completions ignores messages", body: `{"model":"m","messages":5,"prompt":"abcd"}`,
			model: "m", tokens: 1, textBytes: 4},
		{name: "max_completion_tokens wins", body: `{"model":"m","prompt":"a","max_completion_tokens":5,"max_tokens":9}`,
			model: "m", maxTokens: 5, tokens: 1, textBytes: 1},
		{name: "max_completion_tokens wins before", body: `{"model":"m","prompt":"a","max_tokens":9,"max_completion_tokens":5}`,
			model: "m", maxTokens: 5, tokens: 1, textBytes: 1},
		{name: "max_tokens alone", body: `{"model":"m","prompt":"a","max_tokens":9}`,
			model: "m", maxTokens: 9, tokens: 1, textBytes: 1},
		{name: "nulls are unset", body: `{"model":"m","prompt":"a","max_tokens":null,"max_completion_tokens":null,"stream":null}`,
			model: "m", tokens: 1, textBytes: 1},
		{name: "duplicate members: the last wins", body: `{"model":"a","prompt":"abcdefghijkl","model":"b","prompt":"abcd","stream":true,"stream":false}`,
			model: "b", tokens: 1, textBytes: 4},
		{name: "duplicate content: the last wins", chat: true, body: `{"model":"m","messages":[{"role":"user","content":"abcdefghijklmnop","content":"abcd"}]}`,
			model: "m", tokens: 5, textBytes: 4, fixed: 4},
		{name: "escaped model and keys", body: `{"mod\u0065l":"gpt\u002d4","prompt":"abcd"}`,
			model: "gpt-4", tokens: 1, textBytes: 4},
		{name: "whitespace everywhere", body: " \t\r\n{ \"model\" : \"m\" , \"prompt\" : [ 1 , 2 ] } \n",
			model: "m", tokens: 2, fixed: 2},
		{name: "invalid UTF-8 is counted as bytes", body: "{\"model\":\"m\",\"prompt\":\"\xff\xfe\xfd\xfc\"}",
			model: "m", tokens: 1, textBytes: 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseRequest([]byte(tc.body), tc.chat, opts)
			if err != nil {
				t.Fatalf("ParseRequest: %d %s %q", err.Status, err.Code, err.Message)
			}
			if got.Model != tc.model || got.Stream != tc.stream || got.MaxTokens != tc.maxTokens ||
				got.PromptTokens != tc.tokens || got.TextBytes != tc.textBytes || got.FixedTokens != tc.fixed {
				t.Errorf("got model=%q stream=%v max=%d tokens=%d text=%d fixed=%d; want %q %v %d %d %d %d",
					got.Model, got.Stream, got.MaxTokens, got.PromptTokens, got.TextBytes, got.FixedTokens,
					tc.model, tc.stream, tc.maxTokens, tc.tokens, tc.textBytes, tc.fixed)
			}
			if got.PrefixBlocks != 0 {
				t.Errorf("prefix hashing is off, got %d blocks", got.PrefixBlocks)
			}
		})
	}
}

func TestParseRequestErrors(t *testing.T) {
	const forms = `"prompt" must be a string, an array of strings, or an array of token ids`
	tests := []struct {
		name   string
		chat   bool
		body   string
		status int
		code   string
		msg    string
	}{
		{"empty body", false, ``, 400, CodeInvalidRequest, `body is not valid JSON: unexpected end of body at byte 0`},
		{"not JSON", false, `model=m`, 400, CodeInvalidRequest, `body is not valid JSON: unexpected 'm' at byte 0`},
		{"truncated", false, `{"model":"m","prompt":"abc`, 400, CodeInvalidRequest, `body is not valid JSON: unexpected end of body at byte 26`},
		{"trailing comma", false, `{"model":"m","prompt":"a",}`, 400, CodeInvalidRequest, `body is not valid JSON: unexpected '}' at byte 26`},
		{"single quotes", false, `{'model':'m'}`, 400, CodeInvalidRequest, `body is not valid JSON: unexpected ''' at byte 1`},
		{"bad escape", false, `{"model":"m","prompt":"a\qb"}`, 400, CodeInvalidRequest, `body is not valid JSON: invalid escape '\q' in string at byte 24`},
		{"bad unicode escape", false, `{"model":"m","prompt":"\u12G4"}`, 400, CodeInvalidRequest, `body is not valid JSON: invalid \u escape in string at byte 27`},
		{"control character", false, "{\"model\":\"m\",\"prompt\":\"a\nb\"}", 400, CodeInvalidRequest, `body is not valid JSON: control character 0x0a in string at byte 24`},
		{"bad number", false, `{"model":"m","prompt":"a","temperature":01}`, 400, CodeInvalidRequest, `body is not valid JSON: unexpected '1' at byte 41`},
		{"bad literal", false, `{"model":"m","prompt":"a","echo":tru}`, 400, CodeInvalidRequest, `body is not valid JSON: unexpected '}' at byte 36`},
		{"data after the object", false, `{"model":"m","prompt":"a"} {}`, 400, CodeInvalidRequest, `body is not valid JSON: unexpected '{' after the top-level value at byte 27`},
		{"syntax error wins over type error", false, `{"model":5,"prompt":"a",]`, 400, CodeInvalidRequest, `body is not valid JSON: unexpected ']' at byte 24`},
		{"invalid JSON in a skipped member", false, `{"model":"m","prompt":"a","extra":{"a":[1,2,}}`, 400, CodeInvalidRequest, `body is not valid JSON: unexpected '}' at byte 44`},
		{"not an object", false, `["model"]`, 400, CodeInvalidRequest, `body must be a JSON object`},
		{"missing model", false, `{"prompt":"a"}`, 400, CodeInvalidRequest, `missing "model"`},
		{"null model", false, `{"model":null,"prompt":"a"}`, 400, CodeInvalidRequest, `missing "model"`},
		{"empty model", false, `{"model":"","prompt":"a"}`, 400, CodeInvalidRequest, `"model" must be a non-empty string`},
		{"model not a string", false, `{"model":["m"],"prompt":"a"}`, 400, CodeInvalidRequest, `"model" must be a non-empty string, got ["m"]`},
		{"missing prompt", false, `{"model":"m"}`, 400, CodeInvalidRequest, `missing "prompt"`},
		{"null prompt", false, `{"model":"m","prompt":null}`, 400, CodeInvalidRequest, `missing "prompt"`},
		{"empty prompt", false, `{"model":"m","prompt":""}`, 400, CodeInvalidRequest, `"prompt" must not be empty`},
		{"empty prompt array", false, `{"model":"m","prompt":[]}`, 400, CodeInvalidRequest, `"prompt" must not be empty`},
		{"empty string in prompt array", false, `{"model":"m","prompt":["a",""]}`, 400, CodeInvalidRequest, `"prompt"[1] must not be empty`},
		{"empty id array", false, `{"model":"m","prompt":[[1],[]]}`, 400, CodeInvalidRequest, `"prompt"[1] must not be empty`},
		{"prompt number", false, `{"model":"m","prompt":42}`, 400, CodeInvalidRequest, forms + `, got 42`},
		{"prompt object", false, `{"model":"m","prompt":{"text":"a"}}`, 400, CodeInvalidRequest, forms + `, got {"text":"a"}`},
		{"prompt array of objects", false, `{"model":"m","prompt":[{"a":1}]}`, 400, CodeInvalidRequest, forms + `; "prompt"[0] is {"a":1}`},
		{"prompt mixed strings", false, `{"model":"m","prompt":["a",1]}`, 400, CodeInvalidRequest, `"prompt"[1] must be a string like "prompt"[0], got 1`},
		{"prompt mixed ids", false, `{"model":"m","prompt":[1,"a"]}`, 400, CodeInvalidRequest, `"prompt"[1] must be a token id (an integer from 0 to 4294967295), got "a"`},
		{"prompt negative id", false, `{"model":"m","prompt":[1,2,-3]}`, 400, CodeInvalidRequest, `"prompt"[2] must be a token id (an integer from 0 to 4294967295), got -3`},
		{"prompt fractional id", false, `{"model":"m","prompt":[1.5]}`, 400, CodeInvalidRequest, `"prompt"[0] must be a token id (an integer from 0 to 4294967295), got 1.5`},
		{"prompt id too large", false, `{"model":"m","prompt":[4294967296]}`, 400, CodeInvalidRequest, `"prompt"[0] must be a token id (an integer from 0 to 4294967295), got 4294967296`},
		{"prompt nested bad id", false, `{"model":"m","prompt":[[1],[2,true]]}`, 400, CodeInvalidRequest, `"prompt"[1][1] must be a token id (an integer from 0 to 4294967295), got true`},
		{"prompt arrays mixed", false, `{"model":"m","prompt":[[1],2]}`, 400, CodeInvalidRequest, `"prompt"[1] must be an array of token ids like "prompt"[0], got 2`},
		{"max_tokens negative", false, `{"model":"m","prompt":"a","max_tokens":-3}`, 400, CodeInvalidRequest, `"max_tokens" must be a positive integer, got -3`},
		{"max_tokens zero", false, `{"model":"m","prompt":"a","max_tokens":0}`, 400, CodeInvalidRequest, `"max_tokens" must be a positive integer, got 0`},
		{"max_tokens fraction", false, `{"model":"m","prompt":"a","max_tokens":1.5}`, 400, CodeInvalidRequest, `"max_tokens" must be a positive integer, got 1.5`},
		{"max_tokens exponent", false, `{"model":"m","prompt":"a","max_tokens":1e3}`, 400, CodeInvalidRequest, `"max_tokens" must be a positive integer, got 1e3`},
		{"max_tokens string", false, `{"model":"m","prompt":"a","max_tokens":"10"}`, 400, CodeInvalidRequest, `"max_tokens" must be a positive integer, got "10"`},
		{"max_tokens too large", false, `{"model":"m","prompt":"a","max_tokens":3000000000}`, 400, CodeInvalidRequest, `"max_tokens" is too large: 3000000000`},
		{"max_tokens huge", false, `{"model":"m","prompt":"a","max_tokens":99999999999999999999}`, 400, CodeInvalidRequest, `"max_tokens" must be a positive integer, got 99999999999999999999`},
		{"max_completion_tokens bad", false, `{"model":"m","prompt":"a","max_completion_tokens":false}`, 400, CodeInvalidRequest, `"max_completion_tokens" must be a positive integer, got false`},
		{"stream not a boolean", false, `{"model":"m","prompt":"a","stream":"yes"}`, 400, CodeInvalidRequest, `"stream" must be a boolean, got "yes"`},
		{"long raw value is shortened", false, `{"model":"m","prompt":"a","stream":"` + strings.Repeat("y", 100) + `"}`, 400, CodeInvalidRequest, `"stream" must be a boolean, got "` + strings.Repeat("y", 36) + `...`},
		{"missing messages", true, `{"model":"m","prompt":"a"}`, 400, CodeInvalidRequest, `missing "messages"`},
		{"messages not an array", true, `{"model":"m","messages":"hi"}`, 400, CodeInvalidRequest, `"messages" must be an array of messages, got "hi"`},
		{"empty messages", true, `{"model":"m","messages":[]}`, 400, CodeInvalidRequest, `"messages" must not be empty`},
		{"message not an object", true, `{"model":"m","messages":[{"role":"user","content":"a"},"hi"]}`, 400, CodeInvalidRequest, `"messages"[1] must be an object, got "hi"`},
		{"message content number", true, `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":5}]}`, 400, CodeInvalidRequest, `"messages"[1].content must be a string or an array of content parts, got 5`},
		{"message content object", true, `{"model":"m","messages":[{"role":"user","content":{"type":"text"}}]}`, 400, CodeInvalidRequest, `"messages"[0].content must be a string or an array of content parts, got {"type":"text"}`},
		{"message content missing", true, `{"model":"m","messages":[{"role":"user"}]}`, 400, CodeInvalidRequest, `"messages"[0].content is missing`},
		{"message content null", true, `{"model":"m","messages":[{"role":"user","content":null}]}`, 400, CodeInvalidRequest, `"messages"[0].content is missing`},
		{"message role missing", true, `{"model":"m","messages":[{"content":"a"}]}`, 400, CodeInvalidRequest, `"messages"[0].role is missing`},
		{"message role not a string", true, `{"model":"m","messages":[{"role":1,"content":"a"}]}`, 400, CodeInvalidRequest, `"messages"[0].role must be a string, got 1`},
		{"part not an object", true, `{"model":"m","messages":[{"role":"user","content":["a"]}]}`, 400, CodeInvalidRequest, `"messages"[0].content[0] must be an object, got "a"`},
		{"part type missing", true, `{"model":"m","messages":[{"role":"user","content":[{"text":"a"}]}]}`, 400, CodeInvalidRequest, `"messages"[0].content[0].type is missing`},
		{"part type not a string", true, `{"model":"m","messages":[{"role":"user","content":[{"type":7}]}]}`, 400, CodeInvalidRequest, `"messages"[0].content[0].type must be a string, got 7`},
		{"text part without text", true, `{"model":"m","messages":[{"role":"user","content":[{"type":"text"}]}]}`, 400, CodeInvalidRequest, `"messages"[0].content[0].text is missing`},
		{"text part text not a string", true, `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{}},{"type":"text","text":["a"]}]}]}`, 400, CodeInvalidRequest, `"messages"[0].content[1].text must be a string, got ["a"]`},
		{"first semantic error wins", true, `{"model":7,"messages":[{"role":"user","content":5}]}`, 400, CodeInvalidRequest, `"model" must be a non-empty string, got 7`},
		{"type error wins over missing", false, `{"prompt":5}`, 400, CodeInvalidRequest, forms + `, got 5`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseRequest([]byte(tc.body), tc.chat, ParseOptions{BodyLimit: 1 << 20})
			if err == nil {
				t.Fatalf("accepted: %+v", got)
			}
			if err.Status != tc.status || err.Code != tc.code || err.Message != tc.msg {
				t.Errorf("got %d %s %q\nwant %d %s %q", err.Status, err.Code, err.Message, tc.status, tc.code, tc.msg)
			}
			if err.Error() != err.Message {
				t.Errorf("Error() = %q", err.Error())
			}
			if json.Valid([]byte(tc.body)) == strings.HasPrefix(err.Message, "body is not valid JSON") {
				t.Errorf("json.Valid = %v but message %q", json.Valid([]byte(tc.body)), err.Message)
			}
		})
	}
}

func TestParseRequestBodyLimit(t *testing.T) {
	body := []byte(`{"model":"m","prompt":"abcd"}`) // 29 bytes
	for _, tc := range []struct {
		limit int64
		ok    bool
	}{{0, true}, {29, true}, {1000, true}, {28, false}, {1, false}} {
		_, err := ParseRequest(body, false, ParseOptions{BodyLimit: tc.limit})
		if tc.ok != (err == nil) {
			t.Fatalf("limit %d: err %v", tc.limit, err)
		}
		if err != nil && (err.Status != 413 || err.Code != CodeBodyTooLarge ||
			err.Message != fmt.Sprintf("the body is over the limit of %d bytes (router.body_limit_bytes)", tc.limit)) {
			t.Fatalf("limit %d: got %d %s %q", tc.limit, err.Status, err.Code, err.Message)
		}
	}
	// The size is checked before the syntax.
	if _, err := ParseRequest([]byte("{{{{{"), false, ParseOptions{BodyLimit: 4}); err == nil || err.Status != 413 {
		t.Fatalf("got %v", err)
	}
}

func TestParseRequestDeepNesting(t *testing.T) {
	ok := `{"model":"m","prompt":"a","x":` + strings.Repeat("[", 9998) + strings.Repeat("]", 9998) + `}`
	if _, err := ParseRequest([]byte(ok), false, ParseOptions{}); err != nil {
		t.Fatalf("depth 9999: %v", err)
	}
	bad := `{"model":"m","prompt":"a","x":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`
	_, err := ParseRequest([]byte(bad), false, ParseOptions{})
	if err == nil || err.Message != "body is not valid JSON: nesting deeper than 10000 levels at byte 10029" {
		t.Fatalf("depth 10001: %v", err)
	}
	if json.Valid([]byte(bad)) || !json.Valid([]byte(ok)) {
		t.Fatal("encoding/json disagrees on the nesting limit")
	}
	// Deep nesting of unclosed containers must not take the stack.
	huge := `{"model":"m","x":` + strings.Repeat(`[{"a":`, 1<<20)
	if _, err := ParseRequest([]byte(huge), false, ParseOptions{}); err == nil {
		t.Fatal("accepted")
	}
}

// refPrefix computes the expected prefix hashes of a decoded stream, independently of the
// parser: chained XXH64 over full blocks.
func refPrefix(stream []byte, blockBytes int) []uint64 {
	var out []uint64
	seed := uint64(0)
	for len(stream) >= blockBytes && len(out) < MaxPrefixBlocks {
		d := xxhash.NewWithSeed(seed)
		d.Write(stream[:blockBytes])
		seed = d.Sum64()
		out = append(out, seed)
		stream = stream[blockBytes:]
	}
	return out
}

func ids(v ...uint32) []byte {
	var b []byte
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, x)
	}
	return b
}

func chatStream(msgs ...string) []byte { // role, content pairs
	var b []byte
	for i := 0; i < len(msgs); i += 2 {
		b = append(b, msgs[i+1]...)
		b = append(b, roleMarker...)
		b = append(b, msgs[i]...)
	}
	return b
}

func TestParseRequestPrefix(t *testing.T) {
	long := strings.Repeat("0123456789abcdef", 64) // 1 KiB
	tests := []struct {
		name   string
		chat   bool
		block  int
		body   string
		stream []byte
	}{
		{"string prompt", false, 1, `{"model":"m","prompt":"abcdefghij"}`, []byte("abcdefghij")},
		{"escapes hash decoded text", false, 1, `{"model":"m","prompt":"ab\u0063d\nfgh\u00e9"}`, []byte("abcd\nfghé")},
		{"only full blocks", false, 1, `{"model":"m","prompt":"abcdefghijklmno"}`, []byte("abcdefghijklmno")},
		{"at most 32 blocks", false, 2, `{"model":"m","prompt":"` + long + `"}`, []byte(long)},
		{"batch hashes its first prompt", false, 1, `{"model":"m","prompt":["abcdefgh","ijklmnop"]}`, []byte("abcdefgh")},
		{"token ids", false, 2, `{"model":"m","prompt":[1,2,3,4,5,6,7]}`, ids(1, 2, 3, 4, 5, 6, 7)},
		{"many token ids", false, 8, `{"model":"m","prompt":[` + strings.TrimSuffix(strings.Repeat("65535,", 300), ",") + `]}`,
			ids(func() []uint32 {
				v := make([]uint32, 300)
				for i := range v {
					v[i] = 65535
				}
				return v
			}()...)},
		{"batch of id arrays hashes its first", false, 1, `{"model":"m","prompt":[[1,2,3,4],[5,6,7,8]]}`, ids(1, 2, 3, 4)},
		{"chat", true, 1, `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello"}]}`,
			chatStream("system", "be brief", "user", "hello")},
		{"chat content before role", true, 1, `{"model":"m","messages":[{"content":"be brief","role":"system"},{"content":"hello","role":"user"}]}`,
			chatStream("system", "be brief", "user", "hello")},
		{"chat parts", true, 1, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"abc"},{"text":"def","type":"text"}]}]}`,
			chatStream("user", "abcdef")},
		{"chat duplicate content", true, 1, `{"model":"m","messages":[{"role":"user","content":"xxxxxxxxxxxxxx","content":"abcdefgh"}]}`,
			chatStream("user", "abcdefgh")},
		{"chat image part", true, 1, `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"abcd"}]}]}`,
			append(append(append([]byte{}, partMarker...), binary.LittleEndian.AppendUint64(nil, xxhash.Sum64String(`{"type":"image_url","image_url":{"url":"x"}}`))...), chatStream("user", "abcd")...)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseRequest([]byte(tc.body), tc.chat, ParseOptions{BlockTokens: tc.block})
			if err != nil {
				t.Fatal(err)
			}
			want := refPrefix(tc.stream, 4*tc.block)
			if fmt.Sprint(got.PrefixHashes()) != fmt.Sprint(want) {
				t.Errorf("prefix\ngot  %x\nwant %x", got.PrefixHashes(), want)
			}
			if len(want) == 0 {
				t.Errorf("test stream %q makes no block", tc.stream)
			}
		})
	}
}

func TestParseRequestPrefixSharing(t *testing.T) {
	sys := strings.Repeat("You are a helpful assistant. ", 20) // 580 bytes
	body := func(user string) []byte {
		return []byte(`{"model":"m","messages":[{"role":"system","content":"` + sys + `"},{"role":"user","content":"` + user + `"}]}`)
	}
	opts := ParseOptions{BlockTokens: 16} // 64-byte blocks
	a, _ := ParseRequest(body(strings.Repeat("a", 300)), true, opts)
	b, _ := ParseRequest(body(strings.Repeat("b", 300)), true, opts)
	if a.PrefixBlocks != b.PrefixBlocks || a.PrefixBlocks < 10 {
		t.Fatalf("blocks %d %d", a.PrefixBlocks, b.PrefixBlocks)
	}
	shared := 0
	for shared < a.PrefixBlocks && a.Prefix[shared] == b.Prefix[shared] {
		shared++
	}
	if shared != len(sys)/64 {
		t.Fatalf("shared %d blocks, want %d (the system prompt's full blocks)", shared, len(sys)/64)
	}
	for k := shared; k < a.PrefixBlocks; k++ {
		if a.Prefix[k] == b.Prefix[k] {
			t.Fatalf("block %d equal after the divergence", k)
		}
	}
}

func TestParseRequestSizer(t *testing.T) {
	s, err := NewSizer(sizingBytes())
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"model":"llama","prompt":"` + strings.Repeat("x", 400) + `"}`)
	opts := ParseOptions{Sizer: s}
	r, _ := ParseRequest(body, false, opts)
	if r.PromptTokens != 100 {
		t.Fatalf("tokens %d", r.PromptTokens)
	}
	for range 200 {
		s.ObserveRequest(&r, 200) // the true ratio is 2 bytes a token
	}
	r2, _ := ParseRequest(body, false, opts)
	if r2.PromptTokens < 195 || r2.PromptTokens > 205 {
		t.Fatalf("calibrated tokens %d, want about 200", r2.PromptTokens)
	}
	// The model name is interned once the Sizer tracks it.
	if n := testing.AllocsPerRun(100, func() { ParseRequest(body, false, opts) }); n != 0 {
		t.Fatalf("%v allocations with an interned model", n)
	}
	other := []byte(`{"model":"other","prompt":"` + strings.Repeat("x", 400) + `"}`)
	if r3, _ := ParseRequest(other, false, opts); r3.PromptTokens != 100 || r3.Model != "other" {
		t.Fatalf("an unknown model is sized at the default ratio: %+v", r3)
	}
}

func TestParseRequestAllocs(t *testing.T) {
	for _, tc := range benchBodies() {
		body := tc.body
		n := testing.AllocsPerRun(100, func() {
			if _, err := ParseRequest(body, tc.chat, ParseOptions{BlockTokens: 64, NonTextTokens: 576}); err != nil {
				t.Fatal(err)
			}
		})
		if n > 1 {
			t.Errorf("%s: %v allocations, want at most 1 (the model name)", tc.name, n)
		}
	}
}

type benchBody struct {
	name string
	chat bool
	body []byte
}

// benchBodies are realistic request bodies: a 2 KiB chat, a 2 KiB completion, a 64 KiB prompt.
func benchBodies() []benchBody {
	text := func(n int) string {
		words := strings.Fields("the quick brown fox jumps over the lazy dog while a \\\"careful\\\" reader checks each line\\n of the report for errors")
		var b strings.Builder
		for i := 0; b.Len() < n; i++ {
			b.WriteString(words[i%len(words)])
			b.WriteByte(' ')
		}
		return b.String()[:n]
	}
	chat := `{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[` +
		`{"role":"system","content":"` + text(600) + `"},` +
		`{"role":"user","content":"` + text(500) + `"},` +
		`{"role":"assistant","content":"` + text(300) + `"},` +
		`{"role":"user","content":[{"type":"text","text":"` + text(400) + `"}]}],` +
		`"max_completion_tokens":256,"temperature":0.7,"top_p":0.95,"stream":true,"stream_options":{"include_usage":true},"stop":["\n\n"],"user":"u-1234"}`
	completion := `{"model":"meta-llama/Llama-3.1-8B","prompt":"` + text(1900) + `","max_tokens":128,"temperature":0,"stream":false,"logprobs":null,"echo":false}`
	big := `{"model":"meta-llama/Llama-3.1-8B","prompt":"` + text(65400) + `","max_tokens":16,"stream":true}`
	return []benchBody{
		{"chat_2KiB", true, []byte(chat)},
		{"completion_2KiB", false, []byte(completion)},
		{"prompt_64KiB", false, []byte(big)},
	}
}

func BenchmarkParseRequest(b *testing.B) {
	for _, tc := range benchBodies() {
		b.Run(tc.name, func(b *testing.B) {
			opts := ParseOptions{BlockTokens: 64, NonTextTokens: 576, BodyLimit: 4 << 20}
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
