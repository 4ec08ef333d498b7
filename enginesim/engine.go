package enginesim

import (
	"encoding/json"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/narwhal-llm/narwhal/config"
)

// Options configures an Engine.
type Options struct {
	// Profile times the engine: Prefill.Seconds per prompt, Decode.StepSeconds per decode
	// step, Decode.MaxStreams and Decode.MaxKVTokens bound the batch (0 = unbounded), and
	// KVTransferS is the KV handoff after a remote prefill. A profile without a prefill curve
	// cannot prefill locally; one without a decode curve serves only max_tokens=1 requests.
	Profile config.Profile
	// Role ("prefill" or "decode") is informational: it is reported by /health and as a label
	// of enginesim_info. The engine serves any phase, because Narwhal moves roles live
	// without restarting engines.
	Role string
	// Model is the served model name (the metrics' model_name label and /v1/models).
	// Requests may name any model; responses echo the requested one.
	Model string
	// NoiseSigma is the sigma of the log-normal factor (median 1) applied to each prefill
	// time; 0 gives exact profile times.
	NoiseSigma float64
	// Seed seeds the prefill noise and the output-length draws.
	Seed int64
	// DefaultOutputTokens is the mean of the output-length draw for requests without
	// max_tokens (0 = 256, the config default).
	DefaultOutputTokens int
	// Logger receives the engine's logs (nil = discard).
	Logger *slog.Logger
	// Client sends prefill requests to remote prefillers (nil = a keep-alive pooled client
	// owned by the engine).
	Client *http.Client
	// RoleSwitch serves SGLang's POST /pd_role_switch (docs: switch.go); RoleSwitchS is how
	// long a switch rebuilds the engine, and RoleSwitchFail makes every switch fail and the
	// engine unhealthy (a rebuild that fails).
	RoleSwitch     bool
	RoleSwitchS    float64
	RoleSwitchFail bool
	// MaxModelLen is the context limit, as vLLM's --max-model-len: a request whose prompt
	// plus output exceeds it is refused (400 context_length_exceeded), and /v1/models reports
	// it as max_model_len. 0: no limit beyond max_kv_tokens, none reported.
	MaxModelLen int
}

// maxBodyBytes bounds a request body.
const maxBodyBytes = 16 << 20

// Engine is a simulated OpenAI-compatible model server. It implements http.Handler:
//
//	POST /v1/completions        OpenAI completions (stream or not)
//	POST /v1/chat/completions   OpenAI chat completions (stream or not)
//	GET  /v1/models             the served model
//	GET  /health                {"status": "ok", "role": ...}
//	GET  /metrics               Prometheus text with vLLM's metric names
type Engine struct {
	opts      Options
	log       *slog.Logger
	loop      *loop
	lengths   *lengthDraw
	client    *http.Client
	ownClient bool
	metrics   http.Handler
	ids       atomic.Uint64
	closeOnce sync.Once
	closed    atomic.Bool
	sw        roleSwitch
}

// New starts an engine (its scheduler goroutine runs until Close).
func New(o Options) *Engine {
	if o.DefaultOutputTokens <= 0 {
		o.DefaultOutputTokens = 256
	}
	if o.Model == "" {
		o.Model = "enginesim"
	}
	e := &Engine{
		opts:    o,
		log:     o.Logger,
		lengths: newLengthDraw(o.Seed, o.DefaultOutputTokens),
		client:  o.Client,
	}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	if e.client == nil {
		e.client, e.ownClient = defaultClient(), true
	}
	e.sw.role = o.Role
	e.loop = newLoop(newScheduler(o.Profile, o.NoiseSigma, o.Seed))
	e.metrics = newMetricsHandler(e.loop, o.Model, &e.sw)
	return e
}

// Close stops the scheduler; requests still queued or running fail (503, or an error event on
// a stream already started). It is idempotent.
func (e *Engine) Close() {
	e.closeOnce.Do(func() {
		e.closed.Store(true)
		e.loop.close()
		if e.ownClient {
			e.client.CloseIdleConnections()
		}
	})
}

// ServeHTTP routes a request to the engine's endpoints.
func (e *Engine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/completions":
		if allow(w, r, http.MethodPost) {
			e.serveGenerate(w, r, kindCompletion)
		}
	case "/v1/chat/completions":
		if allow(w, r, http.MethodPost) {
			e.serveGenerate(w, r, kindChat)
		}
	case "/health":
		if allow(w, r, http.MethodGet) {
			e.serveHealth(w)
		}
	case "/metrics":
		if allow(w, r, http.MethodGet) {
			e.metrics.ServeHTTP(w, r)
		}
	case "/v1/models":
		if allow(w, r, http.MethodGet) {
			e.serveModels(w)
		}
	case "/pd_role_switch":
		if allow(w, r, http.MethodPost) {
			e.servePDRoleSwitch(w, r)
		}
	default:
		writeError(w, &apiError{status: http.StatusNotFound, message: "no route for " + r.URL.Path,
			typ: "invalid_request_error", code: "not_found"})
	}
}

// allow answers 405 unless r uses method (GET also admits HEAD).
func allow(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method || (method == http.MethodGet && r.Method == http.MethodHead) {
		return true
	}
	w.Header().Set("Allow", method)
	writeError(w, &apiError{status: http.StatusMethodNotAllowed,
		message: r.Method + " is not allowed on " + r.URL.Path + "; use " + method,
		typ:     "invalid_request_error", code: "method_not_allowed"})
	return false
}

func (e *Engine) serveHealth(w http.ResponseWriter) {
	role, healthy := e.sw.state()
	status, code := "ok", http.StatusOK
	switch {
	case e.closed.Load():
		status, code = "closed", http.StatusServiceUnavailable
	case !healthy:
		status, code = "unhealthy", http.StatusServiceUnavailable
	}
	writeJSON(w, code, struct {
		Status string `json:"status"`
		Role   string `json:"role"`
		Model  string `json:"model"`
	}{status, role, e.opts.Model})
}

func (e *Engine) serveModels(w http.ResponseWriter) {
	type model struct {
		ID          string `json:"id"`
		Object      string `json:"object"`
		OwnedBy     string `json:"owned_by"`
		MaxModelLen int    `json:"max_model_len,omitempty"`
	}
	writeJSON(w, http.StatusOK, struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", []model{{e.opts.Model, "model", "enginesim", e.opts.MaxModelLen}}})
}

// writeJSON writes v as a JSON response.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"message":"encoding the response failed","type":"server_error","code":"internal"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// writeError writes an OpenAI-style error body: {"error": {"message", "type", "code"}}.
func writeError(w http.ResponseWriter, e *apiError) {
	type body struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	}
	writeJSON(w, e.status, struct {
		Error body `json:"error"`
	}{body{e.message, e.typ, e.code}})
}

// lengthDraw draws output lengths for requests without max_tokens: exponential with the given
// mean, rounded up, clamped to [1, 4×mean]. Draws are a deterministic sequence for a seed.
type lengthDraw struct {
	mu   sync.Mutex
	rng  *rand.Rand
	mean int
}

func newLengthDraw(seed int64, mean int) *lengthDraw {
	return &lengthDraw{rng: rand.New(rand.NewPCG(uint64(seed), 0x6c656e67746873)), mean: mean} // "lengths"
}

func (d *lengthDraw) next() int {
	d.mu.Lock()
	x := d.rng.ExpFloat64()
	d.mu.Unlock()
	n := int(math.Ceil(x * float64(d.mean)))
	return min(max(n, 1), 4*d.mean)
}

// defaultClient is a pooled client for prefill calls: many idle keep-alive connections per
// prefiller, no overall timeout (a prefill may queue), bounded connect time.
func defaultClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 1024
	t.MaxIdleConnsPerHost = 256
	t.DialContext = (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	t.Proxy = nil // engines talk to engines directly
	return &http.Client{Transport: t}
}
