package enginesim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// apiKind is which OpenAI endpoint a request came to.
type apiKind uint8

const (
	kindCompletion apiKind = iota // POST /v1/completions
	kindChat                      // POST /v1/chat/completions
)

// request is what the engine needs from an OpenAI request body.
type request struct {
	kind         apiKind
	model        string
	stream       bool
	promptTokens int
	maxTokens    int             // 0: the request sets no limit
	kvTransfer   json.RawMessage // kv_transfer_params, echoed back when present
}

// apiError is an OpenAI-style error together with its HTTP status.
type apiError struct {
	status  int
	message string
	typ     string
	code    string
}

func (e *apiError) Error() string { return e.message }

func invalid(format string, args ...any) *apiError {
	return &apiError{
		status:  http.StatusBadRequest,
		message: fmt.Sprintf(format, args...),
		typ:     "invalid_request_error",
		code:    "invalid_request",
	}
}

// wireRequest holds the fields of an OpenAI request the engine reads; others are ignored.
type wireRequest struct {
	Model               *string         `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              *bool           `json:"stream"`
	KVTransferParams    json.RawMessage `json:"kv_transfer_params"`
}

// parseRequest validates an OpenAI request body and sizes its prompt.
func parseRequest(kind apiKind, body []byte) (*request, *apiError) {
	var w wireRequest
	if err := json.Unmarshal(body, &w); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, invalid("field %q has the wrong type (%s)", te.Field, te.Value)
		}
		return nil, invalid("body is not a JSON object: %v", err)
	}
	if w.Model == nil || *w.Model == "" {
		return nil, invalid("missing required field \"model\"")
	}
	r := &request{kind: kind, model: *w.Model}
	if w.Stream != nil {
		r.stream = *w.Stream
	}
	if present(w.KVTransferParams) {
		r.kvTransfer = w.KVTransferParams
	}

	var err error
	switch kind {
	case kindChat:
		if !present(w.Messages) {
			return nil, invalid("missing required field \"messages\"")
		}
		r.promptTokens, err = messagesTokens(w.Messages)
	default:
		if !present(w.Prompt) {
			return nil, invalid("missing required field \"prompt\"")
		}
		r.promptTokens, err = promptTokens(w.Prompt)
	}
	if err != nil {
		return nil, invalid("%v", err)
	}

	limit, name := w.MaxTokens, "max_tokens"
	if w.MaxCompletionTokens != nil {
		limit, name = w.MaxCompletionTokens, "max_completion_tokens"
	}
	if limit != nil {
		if *limit < 1 {
			return nil, invalid("%q must be at least 1, got %d", name, *limit)
		}
		r.maxTokens = *limit
	}
	return r, nil
}

func present(raw json.RawMessage) bool {
	return len(raw) > 0 && !bytes.Equal(raw, []byte("null"))
}

// textTokens is the engine's token count of a text of n UTF-8 bytes: ceil(n/4).
func textTokens(n int) int { return (n + 3) / 4 }

// promptTokens sizes a completions prompt: a string is ceil(bytes/4) tokens; an array of token
// ids is its length; an array of strings, or of token-id arrays, is the sum of its elements.
func promptTokens(raw json.RawMessage) (int, error) {
	raw = bytes.TrimSpace(raw)
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, fmt.Errorf("prompt: %v", err)
		}
		return textTokens(len(s)), nil
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return 0, fmt.Errorf("prompt: %v", err)
		}
		if len(items) == 0 {
			return 0, errors.New("prompt must not be an empty array")
		}
		switch bytes.TrimSpace(items[0])[0] {
		case '"':
			var ss []string
			if err := json.Unmarshal(raw, &ss); err != nil {
				return 0, errors.New("prompt must be a string, an array of strings, or an array of token ids")
			}
			n := 0
			for _, s := range ss {
				n += textTokens(len(s))
			}
			return n, nil
		case '[':
			var ids [][]int64
			if err := json.Unmarshal(raw, &ids); err != nil {
				return 0, errors.New("prompt must be a string, an array of strings, or an array of token ids")
			}
			n := 0
			for _, p := range ids {
				n += len(p)
			}
			return n, nil
		default:
			var ids []int64
			if err := json.Unmarshal(raw, &ids); err != nil {
				return 0, errors.New("prompt must be a string, an array of strings, or an array of token ids")
			}
			return len(ids), nil
		}
	}
	return 0, errors.New("prompt must be a string, an array of strings, or an array of token ids")
}

// wireMessage is one chat message; content is a string, an array of parts, or null.
type wireMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type wirePart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// messagesTokens sizes a chat prompt: per message, ceil(bytes/4) of its text content (a
// string, or the text parts of an array, concatenated) plus 4 for the chat template.
func messagesTokens(raw json.RawMessage) (int, error) {
	var msgs []wireMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return 0, errors.New("\"messages\" must be an array of {role, content} objects")
	}
	if len(msgs) == 0 {
		return 0, errors.New("\"messages\" must not be empty")
	}
	n := 0
	for i, m := range msgs {
		if m.Role == "" {
			return 0, fmt.Errorf("messages[%d]: missing \"role\"", i)
		}
		bytesN := 0
		if present(m.Content) {
			switch bytes.TrimSpace(m.Content)[0] {
			case '"':
				var s string
				if err := json.Unmarshal(m.Content, &s); err != nil {
					return 0, fmt.Errorf("messages[%d].content: %v", i, err)
				}
				bytesN = len(s)
			case '[':
				var parts []wirePart
				if err := json.Unmarshal(m.Content, &parts); err != nil {
					return 0, fmt.Errorf("messages[%d].content must be a string or an array of parts", i)
				}
				for _, p := range parts {
					if p.Type == "text" || p.Type == "" {
						bytesN += len(p.Text)
					}
				}
			default:
				return 0, fmt.Errorf("messages[%d].content must be a string or an array of parts", i)
			}
		}
		n += textTokens(bytesN) + 4
	}
	return n, nil
}
