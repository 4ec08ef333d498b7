package enginesim

import (
	"encoding/json"
	"strconv"
	"strings"
)

// words is the placeholder vocabulary: token i of every response is words[i%len(words)]. Each
// word is one token and needs no JSON escaping.
var words = [...]string{
	" lorem", " ipsum", " dolor", " sit", " amet", " consectetur", " adipiscing", " elit",
	" sed", " do", " eiusmod", " tempor", " incididunt", " ut", " labore", " et",
}

// word returns the text of token i (0-based).
func word(i int) string { return words[i%len(words)] }

// placeholderText is the text of the first n tokens.
func placeholderText(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(word(i))
	}
	return b.String()
}

// Fixed pieces of the SSE frames, after the per-response head.
const (
	completionOpen  = `"text":"`
	completionClose = `","logprobs":null,"finish_reason":null}]}` + "\n\n"
	chatFirstOpen   = `"delta":{"role":"assistant","content":"`
	chatOpen        = `"delta":{"content":"`
	chatClose       = `"},"logprobs":null,"finish_reason":null}]}` + "\n\n"
	sseDone         = "data: [DONE]\n\n"
)

// chunker pre-encodes the SSE frames of one streaming response, so that a token costs a few
// appends into a reused buffer and no allocation.
type chunker struct {
	chat bool
	head []byte // `data: {"id":...,"object":...,"created":...,"model":...,"choices":[{"index":0,`
	buf  []byte
}

func newChunker(kind apiKind, id string, created int64, model string) *chunker {
	object := "text_completion"
	if kind == kindChat {
		object = "chat.completion.chunk"
	}
	m, _ := json.Marshal(model) // a string always marshals
	head := make([]byte, 0, 96+len(id)+len(m))
	head = append(head, `data: {"id":"`...)
	head = append(head, id...) // ids are [a-z0-9-]
	head = append(head, `","object":"`...)
	head = append(head, object...)
	head = append(head, `","created":`...)
	head = strconv.AppendInt(head, created, 10)
	head = append(head, `,"model":`...)
	head = append(head, m...)
	head = append(head, `,"choices":[{"index":0,`...)
	return &chunker{chat: kind == kindChat, head: head, buf: make([]byte, 0, len(head)+128)}
}

// token returns the frame of token i (0-based). The slice is valid until the next call.
func (c *chunker) token(i int) []byte {
	b := append(c.buf[:0], c.head...)
	switch {
	case !c.chat:
		b = append(b, completionOpen...)
		b = append(b, word(i)...)
		b = append(b, completionClose...)
	case i == 0:
		b = append(b, chatFirstOpen...)
		b = append(b, word(i)...)
		b = append(b, chatClose...)
	default:
		b = append(b, chatOpen...)
		b = append(b, word(i)...)
		b = append(b, chatClose...)
	}
	c.buf = b
	return b
}

// final returns the last frame: an empty delta with the finish reason and the usage, followed
// by the [DONE] sentinel.
func (c *chunker) final(finish string, promptTokens, completionTokens int) []byte {
	b := append(c.buf[:0], c.head...)
	if c.chat {
		b = append(b, `"delta":{},"logprobs":null,"finish_reason":"`...)
	} else {
		b = append(b, `"text":"","logprobs":null,"finish_reason":"`...)
	}
	b = append(b, finish...)
	b = append(b, `"}],"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(promptTokens), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(completionTokens), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(promptTokens+completionTokens), 10)
	b = append(b, "}}\n\n"...)
	b = append(b, sseDone...)
	c.buf = b
	return b
}
