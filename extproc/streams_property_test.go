package extproc_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"pgregory.net/rapid"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/gateway"
	"github.com/narwhal-llm/narwhal/router"
)

// sequencesPerCheck: each rapid check runs this many sequences of concurrent streams, so that
// make test runs a few hundred (rapid's default 100 checks) and `make check-long`
// (-rapid.checks=10000) 30,000.
const sequencesPerCheck = 3

// TestStreamsProperty (issue 7) drives the real ext_proc server over gRPC with random whole
// streams: Envoy's message order or a random one with protocol violations, both body modes,
// routed and pass-through paths, valid and invalid bodies, random engine responses (statuses,
// event streams, absurd usage values), cancels and resets at any point, and engine deaths
// (fleet failures) while the streams run. After every sequence, once the server has closed
// every stream, the conservation laws hold and the router holds nothing.
func TestStreamsProperty(t *testing.T) {
	h := newHarness(t, relaxed(gateway.Mode{}), func(c *config.Config) {
		c.Router.WaitingSet.Capacity = 4
		c.Router.WaitingSet.MaxWaitS = 0.1
		c.Router.FirstTokenTimeoutS = 0.05
		c.Health.Passive.ConsecutiveFailures = 2
		p := c.Profiles["fast"]
		p.PrefillConcurrency = 2
		p.Decode.MaxStreams = 3
		p.Decode.MaxKVTokens = 20000
		c.Profiles["fast"] = p
	}, "prefill", "prefill", "decode", "decode")
	rapid.Check(t, func(rt *rapid.T) {
		for range sequencesPerCheck {
			runSequence(rt, h)
		}
	})
	// The runs reached every outcome the laws account for.
	c := h.live.Snapshot().Counters
	t.Logf("%+v", c)
	if c.Invalid == 0 || c.Completed == 0 || c.Failed == 0 || c.Cancelled.InFlight == 0 || c.Dispatched.Total() == 0 || c.ContextLengthExceeded == 0 {
		t.Fatalf("the random streams missed an outcome: %+v", c)
	}
}

// streamScript is one client stream, drawn before it runs.
type streamScript struct {
	msgs     []*extprocv3.ProcessingRequest
	cancelAt int  // cancel (reset) before sending msgs[cancelAt]; len(msgs) for none
	halfOpen bool // at the end, half-close and let the server finish, rather than reset
}

func runSequence(rt *rapid.T, h *harness) {
	n := rapid.IntRange(1, 10).Draw(rt, "streams")
	scripts := make([]streamScript, n)
	for i := range scripts {
		scripts[i] = drawScript(rt)
	}
	type death struct {
		engine string
		after  int // applied after this many streams started
	}
	var deaths []death
	for range rapid.IntRange(0, 2).Draw(rt, "deaths") {
		deaths = append(deaths, death{engine: fmt.Sprintf("e%d", rapid.IntRange(1, 4).Draw(rt, "engine")), after: rapid.IntRange(0, n-1).Draw(rt, "after")})
	}
	var wg sync.WaitGroup
	for i, s := range scripts {
		for _, d := range deaths {
			if d.after == i {
				_, _ = h.fleet.SetLifecycle(d.engine, fleet.Failed, time.Now(), "test")
			}
		}
		wg.Go(func() { h.play(s) })
	}
	wg.Wait()
	s := h.idle()
	if held(s) != (router.Retained{}) {
		rt.Fatalf("held after every stream closed: %+v", s.Retained)
	}
	for _, e := range s.Engines {
		if e.PrefillResidents != 0 || e.DecodeResidents != 0 {
			rt.Fatalf("engine %s keeps residents: %+v", e.ID, e)
		}
	}
	for _, e := range h.fleet.Snapshot().Engines { // readmit the dead for the next sequence
		if e.Lifecycle == fleet.Failed {
			_, _ = h.fleet.SetLifecycle(e.ID, fleet.Recovering, time.Now(), "test")
			_, _ = h.fleet.SetLifecycle(e.ID, fleet.Active, time.Now(), "test")
		}
	}
}

// play runs one script as a client: messages are sent without waiting for replies (a server
// must not rely on Envoy's lock-step), replies are drained until the server ends the stream.
func (h *harness) play(s streamScript) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ps, err := extprocv3.NewExternalProcessorClient(h.conn).Process(ctx)
	if err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := ps.Recv(); err != nil {
				return
			}
		}
	}()
	for i, m := range s.msgs {
		if i == s.cancelAt {
			cancel()
			break
		}
		if ps.Send(m) != nil {
			break
		}
	}
	if s.halfOpen {
		_ = ps.CloseSend()
		<-done // the server ends the stream: after its last reply, or its waiting limit
	}
	cancel()
	<-done
}

func drawScript(rt *rapid.T) streamScript {
	duplex := rapid.Bool().Draw(rt, "duplex")
	mode := extprocfilterv3.ProcessingMode_BUFFERED
	if duplex {
		mode = extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	path := rapid.SampledFrom([]string{"/v1/completions", "/v1/completions", "/v1/chat/completions", "/other"}).Draw(rt, "path")
	head := msgRequestHeaders(path, false)
	head.ProtocolConfig.RequestBodyMode = mode
	prompt := `"prompt":"` + rapid.StringMatching(`[a-z ]{0,200}`).Draw(rt, "prompt") + `"`
	if path == "/v1/chat/completions" {
		prompt = `"messages":[{"role":"user","content":"` + rapid.StringMatching(`[a-z ]{0,200}`).Draw(rt, "content") + `"}]`
	}
	var body string
	switch rapid.IntRange(0, 7).Draw(rt, "body") {
	case 0:
		body = `{"model":"m",` + prompt // not JSON
	case 1:
		body = `{"model":"m",` + prompt + `,"max_tokens":2147483647}` // no engine holds it
	default:
		maxTokens := rapid.SampledFrom([]string{"", `,"max_tokens":1`, `,"max_tokens":50`, `,"max_tokens":5000`}).Draw(rt, "max")
		body = `{"model":"m",` + prompt + `,"stream":true` + maxTokens + `}`
	}
	msgs := []*extprocv3.ProcessingRequest{head}
	if chunks := rapid.IntRange(1, 3).Draw(rt, "chunks"); duplex && chunks > 1 {
		step := len(body)/chunks + 1
		for i := 0; i < len(body); i += step {
			msgs = append(msgs, msgRequestBody(body[i:min(i+step, len(body))], i+step >= len(body)))
		}
	} else {
		msgs = append(msgs, msgRequestBody(body, true))
	}
	if duplex && rapid.Bool().Draw(rt, "request trailers") {
		msgs[len(msgs)-1].GetRequestBody().EndOfStream = false
		msgs = append(msgs, msgRequestTrailers())
	}
	switch rapid.IntRange(0, 5).Draw(rt, "response") {
	case 0: // an event stream with a usage value, plausible or absurd
		usage := rapid.SampledFrom([]string{"0", "5", "300", "1099511627776", "-3", "1e30", "99999999999999999999", `"x"`}).Draw(rt, "usage")
		msgs = append(msgs, msgResponseHeaders(200, "text/event-stream", false))
		for range rapid.IntRange(0, 3).Draw(rt, "events") {
			msgs = append(msgs, msgResponseBody(`data: {"choices":[{"text":"a"}]}`+"\n\n", false))
		}
		msgs = append(msgs, msgResponseBody(`data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":`+usage+`}}`+"\n\ndata: [DONE]\n\n", true))
	case 1: // a whole JSON response
		msgs = append(msgs, msgResponseHeaders(200, "application/json", false), msgResponseBody(`{"choices":[]}`, true))
	case 2: // the engine failed it, or Envoy answered its reset
		msgs = append(msgs, msgResponseHeaders(rapid.SampledFrom([]int{500, 502, 503}).Draw(rt, "5xx"), "text/plain", true))
	case 3:
		msgs = append(msgs, msgResponseHeaders(429, "application/json", false), msgResponseBody(`{}`, true))
	case 4: // response headers only: the stream stays open until it is reset
		msgs = append(msgs, msgResponseHeaders(200, "text/event-stream", false))
	}
	if rapid.IntRange(0, 4).Draw(rt, "violate") == 0 { // one message where it does not belong
		any := []*extprocv3.ProcessingRequest{
			msgRequestHeaders("/v1/completions", false), msgRequestBody(`{"model":"m","prompt":"x"}`, true), msgRequestTrailers(),
			msgResponseHeaders(200, "text/event-stream", false), msgResponseBody("data: {}\n\n", false), msgResponseTrailers(),
		}
		m := any[rapid.IntRange(0, len(any)-1).Draw(rt, "stray")]
		at := rapid.IntRange(0, len(msgs)).Draw(rt, "at")
		msgs = append(msgs[:at], append([]*extprocv3.ProcessingRequest{m}, msgs[at:]...)...)
	}
	s := streamScript{msgs: msgs, cancelAt: len(msgs)}
	if rapid.IntRange(0, 3).Draw(rt, "cancel") == 0 {
		s.cancelAt = rapid.IntRange(0, len(msgs)).Draw(rt, "cancel at")
	}
	s.halfOpen = rapid.Bool().Draw(rt, "half-close")
	return s
}
