package enginesim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/narwhal-llm/narwhal/wire"
)

// headerPrefiller (wire.HeaderPrefiller) names the prefill engine (host:port) of a
// disaggregated request, in llm-d's decode-sidecar convention: the engine that receives the
// request asks the named prefiller for the prompt's KV, then decodes locally.
const headerPrefiller = wire.HeaderPrefiller

// prefillRemote asks the prefiller at hostport to prefill the request: the same path and body,
// but one output token, no streaming, and kv_transfer_params {"do_remote_decode": true}. It
// returns nil once the prefiller has answered 200 and its body has been read.
func (e *Engine) prefillRemote(ctx context.Context, r *http.Request, hostport string, body []byte) error {
	pb, err := prefillBody(body)
	if err != nil {
		return fmt.Errorf("prefiller %s: building the prefill request: %w", hostport, err)
	}
	preq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+hostport+r.URL.Path, bytes.NewReader(pb))
	if err != nil {
		return fmt.Errorf("prefiller %s: %w", hostport, err)
	}
	preq.Header.Set("Content-Type", "application/json")
	if id := r.Header.Get("x-request-id"); id != "" {
		preq.Header.Set("x-request-id", id)
	}
	resp, err := e.client.Do(preq)
	if err != nil {
		return fmt.Errorf("prefiller %s unreachable: %w", hostport, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("prefiller %s answered %s: %s", hostport, resp.Status, bytes.TrimSpace(msg))
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return fmt.Errorf("prefiller %s: reading its response: %w", hostport, err)
	}
	return nil
}

// prefillBody rewrites a request body into its prefill-only form. Unknown fields pass through.
func prefillBody(body []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	m["max_tokens"] = json.RawMessage("1")
	delete(m, "max_completion_tokens")
	m["stream"] = json.RawMessage("false")
	delete(m, "stream_options")
	m["kv_transfer_params"] = json.RawMessage(`{"do_remote_decode":true}`)
	return json.Marshal(m)
}
