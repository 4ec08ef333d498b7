package profiler

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/narwhal-llm/narwhal/engineclient"
)

// Engine speaks to one OpenAI-compatible engine (vLLM, SGLang, enginesim) for measurement:
// its model list, timed streamed completions, and its Prometheus metrics.
type Engine struct {
	URL   string // base URL, e.g. http://10.0.0.11:8000
	Model string
	HTTP  *http.Client
}

// NewEngine checks rawURL and returns an Engine with a client of its own (keep-alive, many
// connections: decode batches open one per stream).
func NewEngine(rawURL, model string) (*Engine, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("engine URL %q: want http://host:port", rawURL)
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost, t.MaxConnsPerHost, t.Proxy = 2048, 0, nil
	return &Engine{URL: strings.TrimRight(u.String(), "/"), Model: model, HTTP: &http.Client{Transport: t}}, nil
}

// StatusError is an engine's answer other than 200.
type StatusError struct {
	Op     string // "POST /v1/completions", ...
	Status int
	Code   string // the OpenAI error code, when the body has one
	Body   string // the start of the body
}

func (e *StatusError) Error() string {
	s := fmt.Sprintf("%s answered %d", e.Op, e.Status)
	if e.Code != "" {
		s += " " + e.Code
	}
	if e.Body != "" {
		s += ": " + e.Body
	}
	return s
}

// statusError reads what resp says about its failure.
func statusError(op string, resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	var e struct {
		Error struct {
			Message string `json:"message"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	se := &StatusError{Op: op, Status: resp.StatusCode, Body: strings.TrimSpace(string(b))}
	if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
		se.Body = e.Error.Message
		if c, ok := e.Error.Code.(string); ok {
			se.Code = c
		}
	}
	if len(se.Body) > 200 {
		se.Body = se.Body[:200] + "..."
	}
	return se
}

// ContextExceeded reports whether err is the engine refusing a prompt over its context
// (vLLM and enginesim answer 400; the message or code says so).
func ContextExceeded(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Status == http.StatusBadRequest &&
		(se.Code == "context_length_exceeded" || strings.Contains(strings.ToLower(se.Body), "context length") ||
			strings.Contains(strings.ToLower(se.Body), "maximum context"))
}

// Served is what GET /v1/models says of the model.
type Served struct {
	Models      []string // every model the engine serves
	MaxModelLen int      // the model's context limit (vLLM's max_model_len), 0 when not said
}

// Models reads GET /v1/models. A server that does not answer it in OpenAI's shape is an error
// that says so.
func (e *Engine) Models(ctx context.Context) (Served, error) {
	var s Served
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.URL+"/v1/models", nil)
	if err != nil {
		return s, err
	}
	resp, err := e.HTTP.Do(req)
	if err != nil {
		return s, fmt.Errorf("%s: %w", e.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("%s is not an OpenAI-compatible server: %w", e.URL, statusError("GET /v1/models", resp))
	}
	var body struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&body); err != nil || body.Object != "list" {
		return s, fmt.Errorf("%s is not an OpenAI-compatible server: GET /v1/models is not a model list (%v)", e.URL, err)
	}
	for _, m := range body.Data {
		s.Models = append(s.Models, m.ID)
		if m.ID == e.Model {
			s.MaxModelLen = m.MaxModelLen
		}
	}
	return s, nil
}

// Trace is one timed streamed completion.
type Trace struct {
	Sent   time.Time   // the request was sent
	Tokens []time.Time // the arrival of each frame that carried text, in order
	End    time.Time   // the stream ended ([DONE] or EOF)
	// PromptTokens and CompletionTokens are the engine's usage (0 when it sent none).
	PromptTokens, CompletionTokens int
}

// TTFT is the time from the request to its first token.
func (t *Trace) TTFT() time.Duration {
	if len(t.Tokens) == 0 {
		return 0
	}
	return t.Tokens[0].Sub(t.Sent)
}

// Request is one completion to time.
type Request struct {
	Prompt    string
	MaxTokens int
	Header    http.Header // extra headers (the handoff header for a disaggregated request)
}

// Stream sends a streamed completion and times its frames. Usage is asked for
// (stream_options.include_usage, which vLLM needs; enginesim always sends it).
func (e *Engine) Stream(ctx context.Context, r Request) (Trace, error) {
	var tr Trace
	body, _ := json.Marshal(map[string]any{
		"model": e.Model, "prompt": r.Prompt, "max_tokens": r.MaxTokens, "stream": true,
		"temperature": 0, "ignore_eos": true, "stream_options": map[string]any{"include_usage": true},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return tr, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range r.Header {
		req.Header[k] = v
	}
	tr.Sent = time.Now()
	resp, err := e.HTTP.Do(req)
	if err != nil {
		return tr, fmt.Errorf("%s: %w", e.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return tr, statusError("POST /v1/completions", resp)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue
		}
		line = bytes.TrimSpace(line)
		if string(line) == "[DONE]" {
			tr.End = time.Now()
			return tr, nil
		}
		var f struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(line, &f); err != nil {
			return tr, fmt.Errorf("POST /v1/completions: a stream frame is not JSON: %w", err)
		}
		if f.Error != nil {
			return tr, fmt.Errorf("POST /v1/completions: the engine failed the stream: %s", f.Error.Message)
		}
		if len(f.Choices) > 0 && f.Choices[0].Text != "" {
			tr.Tokens = append(tr.Tokens, time.Now())
		}
		if f.Usage != nil {
			tr.PromptTokens, tr.CompletionTokens = f.Usage.PromptTokens, f.Usage.CompletionTokens
		}
	}
	if err := sc.Err(); err != nil {
		return tr, fmt.Errorf("POST /v1/completions: the stream broke: %w", err)
	}
	return tr, fmt.Errorf("POST /v1/completions: the stream ended without [DONE]")
}

// Metrics scrapes the engine's GET /metrics (engineclient.ParseMetrics).
func (e *Engine) Metrics(ctx context.Context) (engineclient.Metrics, error) {
	return engineclient.ScrapeMetrics(ctx, e.HTTP, e.URL+"/metrics")
}
