package enginesim

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/narwhal-llm/narwhal/config"
)

// errEngineClosed is the error body of requests failed by Close.
var errEngineClosed = &apiError{status: http.StatusServiceUnavailable, message: "engine closed",
	typ: "server_error", code: "engine_closed"}

// serveGenerate handles one completions or chat request end to end: parse, size, optionally
// prefill remotely and wait out the KV transfer, hand the job to the scheduler, then relay its
// tokens to the client as they are produced.
func (e *Engine) serveGenerate(w http.ResponseWriter, r *http.Request, kind apiKind) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			writeError(w, &apiError{status: http.StatusRequestEntityTooLarge,
				message: "body exceeds " + strconv.Itoa(maxBodyBytes) + " bytes",
				typ:     "invalid_request_error", code: "body_too_large"})
			return
		}
		writeError(w, invalid("reading the body: %v", err))
		return
	}
	req, aerr := parseRequest(kind, body)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if aerr := e.sw.admit(); aerr != nil {
		writeError(w, aerr)
		return
	}
	defer e.sw.done()
	prefiller := r.Header.Get(headerPrefiller)
	if prefiller != "" {
		if _, _, err := net.SplitHostPort(prefiller); err != nil {
			writeError(w, invalid("header %s must be host:port, got %q", headerPrefiller, prefiller))
			return
		}
	}
	disagg := prefiller != ""

	output, explicit := req.maxTokens, req.maxTokens > 0
	if !explicit {
		output = e.lengths.next()
	}
	if output, aerr = e.fit(req.promptTokens, output, explicit, disagg); aerr != nil {
		writeError(w, aerr)
		return
	}
	if e.closed.Load() {
		writeError(w, errEngineClosed)
		return
	}

	ctx := r.Context()
	if disagg {
		if err := e.prefillRemote(ctx, r, prefiller, body); err != nil {
			if ctx.Err() != nil {
				return // the client left; nobody to answer
			}
			e.log.Warn("remote prefill failed", "prefiller", prefiller, "err", err)
			writeError(w, &apiError{status: http.StatusBadGateway, message: err.Error(),
				typ: "server_error", code: "prefiller_failed"})
			return
		}
		if !sleepCtx(ctx, config.Seconds(e.opts.Profile.KVTransferS)) {
			return
		}
	}

	j := newJob(e.ids.Add(1), req.promptTokens, output, explicit, disagg)
	if err := e.loop.submit(j); err != nil {
		writeError(w, errEngineClosed)
		return
	}
	id := "cmpl-" + strconv.FormatUint(j.id, 10)
	if kind == kindChat {
		id = "chat" + id
	}
	created := time.Now().Unix()
	if req.stream {
		e.stream(ctx, w, j, newChunker(kind, id, created, req.model))
		return
	}
	e.respond(ctx, w, j, req, id, created)
}

// fit checks that the engine can serve a request of prompt+output tokens and returns the
// output length to use (a drawn length is shortened to fit max_kv_tokens; an explicit one is
// refused as vLLM refuses a request beyond its context).
func (e *Engine) fit(prompt, output int, explicit, disagg bool) (int, *apiError) {
	p := e.opts.Profile
	if m := e.opts.MaxModelLen; m > 0 && prompt+output > m {
		if explicit || prompt >= m {
			return 0, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "context_length_exceeded",
				message: "prompt (" + strconv.Itoa(prompt) + " tokens) plus output (" + strconv.Itoa(output) +
					" tokens) exceeds this model's maximum context length of " + strconv.Itoa(m) + " tokens"}
		}
		output = m - prompt
	}
	if !disagg && p.Prefill == nil {
		return 0, &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "phase_unavailable",
			message: "this engine's profile has no prefill curve; send " + headerPrefiller}
	}
	if (disagg || output > 1) && p.Decode == nil {
		return 0, &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "phase_unavailable",
			message: "this engine's profile has no decode curve; only max_tokens=1 requests are served"}
	}
	if p.Decode != nil && p.Decode.MaxKVTokens > 0 && prompt+output > p.Decode.MaxKVTokens {
		if explicit || prompt >= p.Decode.MaxKVTokens {
			return 0, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "context_length_exceeded",
				message: "prompt (" + strconv.Itoa(prompt) + " tokens) plus output (" + strconv.Itoa(output) +
					" tokens) exceeds this engine's " + strconv.Itoa(p.Decode.MaxKVTokens) + " KV tokens"}
		}
		output = p.Decode.MaxKVTokens - prompt
	}
	return output, nil
}

// stream relays j's tokens as server-sent events, one frame per token, flushed as they come;
// then a final frame with finish_reason and usage, then [DONE]. A client that goes away
// cancels j at once.
func (e *Engine) stream(ctx context.Context, w http.ResponseWriter, j *job, c *chunker) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	flush := func() {
		if flusher != nil {
			flusher.Flush()
		}
	}
	flush()
	sent := 0
	for {
		select {
		case <-j.notify:
		case <-ctx.Done():
			e.loop.cancel(j)
			return
		}
		st, n := j.observe()
		for ; sent < n; sent++ {
			if _, err := w.Write(c.token(sent)); err != nil {
				e.loop.cancel(j)
				return
			}
		}
		switch st {
		case jobFinished:
			_, _ = w.Write(c.final(j.finishReason(), j.prompt, n))
		case jobFailed:
			_, _ = w.Write([]byte(`data: {"error":{"message":"engine closed","type":"server_error","code":"engine_closed"}}` + "\n\n"))
		}
		flush()
		if st.terminal() {
			return
		}
	}
}

// Non-streaming response bodies.
type (
	usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	}
	completionChoice struct {
		Index        int       `json:"index"`
		Text         string    `json:"text"`
		Logprobs     *struct{} `json:"logprobs"`
		FinishReason string    `json:"finish_reason"`
	}
	chatMessage struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	chatChoice struct {
		Index        int         `json:"index"`
		Message      chatMessage `json:"message"`
		Logprobs     *struct{}   `json:"logprobs"`
		FinishReason string      `json:"finish_reason"`
	}
	completionResponse struct {
		ID               string          `json:"id"`
		Object           string          `json:"object"`
		Created          int64           `json:"created"`
		Model            string          `json:"model"`
		Choices          any             `json:"choices"`
		Usage            usage           `json:"usage"`
		KVTransferParams json.RawMessage `json:"kv_transfer_params,omitempty"`
	}
)

// respond waits for j to finish and writes one JSON response.
func (e *Engine) respond(ctx context.Context, w http.ResponseWriter, j *job, req *request, id string, created int64) {
	for {
		select {
		case <-j.notify:
		case <-ctx.Done():
			e.loop.cancel(j)
			return
		}
		st, n := j.observe()
		switch st {
		case jobFinished:
			resp := completionResponse{
				ID: id, Created: created, Model: req.model,
				Usage:            usage{req.promptTokens, n, req.promptTokens + n},
				KVTransferParams: req.kvTransfer,
			}
			text, finish := placeholderText(n), j.finishReason()
			if req.kind == kindChat {
				resp.Object = "chat.completion"
				resp.Choices = []chatChoice{{Message: chatMessage{"assistant", text}, FinishReason: finish}}
			} else {
				resp.Object = "text_completion"
				resp.Choices = []completionChoice{{Text: text, FinishReason: finish}}
			}
			writeJSON(w, http.StatusOK, resp)
			return
		case jobFailed:
			writeError(w, errEngineClosed)
			return
		case jobCancelled:
			return
		}
	}
}

// sleepCtx waits d or until ctx is done; it reports whether the wait completed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
