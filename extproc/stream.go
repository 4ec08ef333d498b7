package extproc

import (
	"context"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/router"
	"github.com/narwhal-llm/narwhal/wire"
)

// phase is where one request is in its ext_proc exchange. It only moves forward.
type phase uint8

const (
	phaseHeaders   phase = iota // waiting for request headers
	phaseBody                   // reading the request body of a routed request
	phaseResponse               // placed (or passed through): waiting for response headers
	phaseStreaming              // observing the response body
	phaseDone                   // answered, or the response ended
)

// seen records which parts of the HTTP exchange Envoy has sent on the stream.
type seen uint8

const (
	seenRequestHeaders seen = 1 << iota
	seenRequestEnd          // the request ended: end_of_stream, or its trailers
	seenResponseHeaders
	seenResponseEnd
	seenResponseTrailers
)

// stream is one request's state: the protocol phase, the request facts, the placement, and what
// the response showed. Small on purpose.
type stream struct {
	s      *Server
	ctx    context.Context
	phase  phase
	seen   seen
	closed bool // an ImmediateResponse ended the exchange

	routed, chat   bool
	fullDuplex     bool                      // request body mode FULL_DUPLEX_STREAMED
	respDuplex     bool                      // response body mode FULL_DUPLEX_STREAMED
	refuseStreamed bool                      // request body mode STREAMED: no body-based placement possible
	strip          *extprocv3.HeaderMutation // client routing headers to remove
	waited         time.Duration             // time spent in the waiting set during this message
	id             string
	body           []byte // full-duplex request body being gathered

	req      Request
	placed   bool
	handle   router.Handle
	arrival  time.Time
	firstAt  time.Time
	projTTFT float64
	obs      ResponseObserver

	out []*extprocv3.ProcessingResponse
}

func newStream(s *Server, ctx context.Context) *stream {
	return &stream{s: s, ctx: ctx}
}

// step handles one message from Envoy and returns the replies to send, in order. A message that
// does not fit the exchange so far (order) is a protocol violation: step returns it as an
// error, after releasing what the request held, and the stream must end.
func (st *stream) step(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
	st.out = st.out[:0]
	if what := st.order(req); what != "" {
		if st.placed { // the exchange broke: the request failed, through no fault of the engine
			st.settle(func() error { return st.s.placer.Fail(st.handle, router.FailRequest) })
		}
		st.phase = phaseDone
		st.s.metrics.protocolError()
		return nil, &ProtocolError{What: what}
	}
	start := st.s.now()
	if pc := req.GetProtocolConfig(); pc != nil {
		st.fullDuplex = pc.GetRequestBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		st.respDuplex = pc.GetResponseBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		if pc.GetRequestBodyMode() == filterv3.ProcessingMode_STREAMED {
			st.refuseStreamed = true
		}
	}
	var name string
	switch r := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		name = "request_headers"
		st.requestHeaders(r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		name = "request_body"
		st.requestBody(r.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		name = "request_trailers"
		st.requestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		name = "response_headers"
		st.responseHeaders(r.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		name = "response_body"
		st.responseBody(r.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		name = "response_trailers"
		st.reply(continueTrailers(false))
	default:
		return nil, nil // flow-control-only messages carry no request part and need no reply
	}
	st.s.metrics.observePhase(name, st.s.now().Sub(start)-st.waited)
	st.waited = 0
	return st.out, nil
}

// ProtocolError is an ext_proc message that does not fit its stream: Envoy sends one HTTP
// request per stream, request headers first, each direction in the order headers, body,
// trailers, and the response only once the request has been answered. Narwhal does not trust
// its client to: the stream ends with InvalidArgument and the request releases what it held.
type ProtocolError struct{ What string }

func (e *ProtocolError) Error() string {
	return "narwhal: ext_proc protocol violation: " + e.What + " (one stream carries one HTTP request, in Envoy's message order)"
}

// order checks that a message fits what the stream has seen and records it; it returns what
// is wrong, or "" when the message fits.
func (st *stream) order(req *extprocv3.ProcessingRequest) string {
	has := func(s seen) bool { return st.seen&s != 0 }
	if st.phase == phaseDone && st.closed {
		return "a message after Narwhal answered the request itself"
	}
	var eos bool
	switch r := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if has(seenRequestHeaders) {
			return "request_headers a second time"
		}
		st.seen |= seenRequestHeaders
		eos = r.RequestHeaders.GetEndOfStream()
		if eos {
			st.seen |= seenRequestEnd
		}
		return ""
	case nil:
		return ""
	}
	if !has(seenRequestHeaders) {
		return "a message before request_headers"
	}
	switch r := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestBody:
		if has(seenRequestEnd) {
			return "request_body after the request ended"
		}
		if r.RequestBody.GetEndOfStream() {
			st.seen |= seenRequestEnd
		}
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if has(seenRequestEnd) {
			return "request_trailers after the request ended"
		}
		st.seen |= seenRequestEnd
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		switch {
		case has(seenResponseHeaders):
			return "response_headers a second time"
		case st.phase == phaseHeaders || st.phase == phaseBody:
			return "response_headers before the request was answered"
		}
		st.seen |= seenResponseHeaders
		if r.ResponseHeaders.GetEndOfStream() {
			st.seen |= seenResponseEnd
		}
	case *extprocv3.ProcessingRequest_ResponseBody:
		switch {
		case !has(seenResponseHeaders):
			return "response_body before response_headers"
		case has(seenResponseEnd):
			return "response_body after the response ended"
		}
		if r.ResponseBody.GetEndOfStream() {
			st.seen |= seenResponseEnd
		}
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		switch {
		case !has(seenResponseHeaders):
			return "response_trailers before response_headers"
		case has(seenResponseTrailers):
			return "response_trailers a second time"
		}
		st.seen |= seenResponseTrailers | seenResponseEnd
	}
	return ""
}

func (st *stream) reply(r *extprocv3.ProcessingResponse) { st.out = append(st.out, r) }

// reject answers the request with an ImmediateResponse, which ends the exchange.
func (st *stream) reject(r rejection, details string) {
	st.reply(immediate(r, details))
	st.phase, st.closed = phaseDone, true
}

// requestHeaders strips client routing headers on every path; a routed request then waits for
// its body (in full duplex the headers reply is held until the body is read).
func (st *stream) requestHeaders(h *extprocv3.HttpHeaders) {
	var path, envoyID string
	var strip []string
	for _, hv := range h.GetHeaders().GetHeaders() {
		k := hv.GetKey()
		switch {
		case k == ":path":
			path = headerValue(hv)
		case k == "x-request-id":
			envoyID = headerValue(hv)
		case k == wire.HeaderDestination || k == wire.HeaderPrefiller || strings.HasPrefix(k, wire.HeaderPrefix):
			strip = append(strip, k)
		}
	}
	var mut *extprocv3.HeaderMutation
	if len(strip) > 0 {
		mut = &extprocv3.HeaderMutation{RemoveHeaders: strip}
	}
	st.routed, st.chat = st.s.routed(path)
	if !st.routed {
		st.phase = phaseResponse
		st.reply(continueRequestHeaders(mut))
		return
	}
	st.id = st.s.requestID(envoyID)
	st.arrival = st.s.now()
	if st.refuseStreamed {
		st.reject(rejection{status: 500, code: "unsupported_body_mode",
			message: "narwhal: request_body_mode STREAMED cannot carry a body-based placement; configure BUFFERED or FULL_DUPLEX_STREAMED"},
			"narwhal_streamed_request_body_mode")
		return
	}
	st.strip = mut
	if h.GetEndOfStream() { // no body at all
		st.offer(nil)
		return
	}
	st.phase = phaseBody
	if !st.fullDuplex {
		st.reply(continueRequestHeaders(mut))
	}
}

// requestBody reads the body: BUFFERED sends it whole; full duplex in chunks, gathered here.
func (st *stream) requestBody(b *extprocv3.HttpBody) {
	if st.phase != phaseBody { // a passed-through request's body
		if st.fullDuplex { // Envoy forwards only what comes back
			st.reply(echoRequestBody(b.GetBody(), b.GetEndOfStream()))
			return
		}
		st.reply(requestBodyContinue)
		return
	}
	if !st.fullDuplex {
		body := b.Body
		b.Body = nil // Envoy keeps the buffered body: a waiting request does not hold it here
		st.offer(body)
		return
	}
	if len(st.body)+len(b.GetBody()) <= int(st.s.cfg.BodyLimitBytes)+1 {
		st.body = append(st.body, b.GetBody()...)
	} else if len(st.body) <= int(st.s.cfg.BodyLimitBytes) {
		st.body = append(st.body, b.GetBody()[:int(st.s.cfg.BodyLimitBytes)+1-len(st.body)]...)
	}
	if b.GetEndOfStream() {
		st.offer(st.body)
	}
}

// requestTrailers ends a full-duplex body that was not ended by its last chunk.
func (st *stream) requestTrailers() {
	if st.phase == phaseBody && st.fullDuplex {
		st.offer(st.body)
		if st.closed {
			return
		}
	}
	st.reply(continueTrailers(true))
}

// offer parses and sizes the body, asks the router, and answers with the placement or a
// rejection. It blocks while the request waits in the waiting set; the body is not used (nor
// kept alive) past parsing.
func (st *stream) offer(body []byte) {
	if st.parse(body) {
		st.place()
	}
}

// parse reads the request into st.req, or answers 413/400 and reports false.
func (st *stream) parse(body []byte) bool {
	if int64(len(body)) > st.s.cfg.BodyLimitBytes {
		st.s.placer.Invalid()
		st.reject(rejection{status: 413, code: "body_too_large",
			message: "request body is " + strconv.Itoa(len(body)) + " bytes or more; the limit is " + strconv.FormatInt(st.s.cfg.BodyLimitBytes, 10)},
			"narwhal_body_too_large")
		return false
	}
	req, perr := ParseRequest(body, st.chat, st.s.parse)
	if perr != nil {
		st.s.placer.Invalid()
		st.reject(rejection{status: perr.Status, code: perr.Code, message: perr.Message}, "narwhal_invalid_request")
		return false
	}
	st.req = req
	return true
}

// place offers the parsed request to the router and answers with its outcome.
func (st *stream) place() {
	req := &st.req
	waitStart := st.s.now()
	out, err := st.s.placer.Offer(st.ctx, router.Offer{
		ID: st.id, PromptTokens: req.PromptTokens, MaxTokens: req.MaxTokens, NonStreaming: !req.Stream, Prefix: st.req.PrefixHashes(),
	})
	if out.Status != router.Dispatched || err != nil {
		st.waited = st.s.now().Sub(waitStart)
	}
	switch {
	case err != nil: // the client went away while waiting; Offer released it
		st.phase, st.closed = phaseDone, true
	case out.Status == router.Rejected:
		st.reject(rejection{status: out.Code.Status(), code: out.Code.String(), message: rejectMessage(out), retryAfter: out.RetryAfterS},
			"narwhal_"+out.Code.String())
	default:
		st.placed, st.handle, st.projTTFT = true, out.Handle, out.Placement.ProjectedTTFT
		st.s.metrics.observeWait(st.waited)
		st.answerPlacement(out.Placement)
	}
}

func rejectMessage(o router.Outcome) string {
	switch o.Code {
	case router.WaitingSetFull:
		return "the waiting set is full; retry later"
	case router.PredictedSLOMiss:
		return "the request would miss its time-to-first-token objective; retry later"
	case router.FallbackBusy:
		return "no prefill engine is live and the fallback engine is still draining; retry later"
	case router.NoCapacity:
		return "no live engine can take the request"
	case router.WaitTimeout:
		return "the request waited longer than the waiting set allows"
	case router.ContextLengthExceeded:
		return "the request needs " + strconv.FormatInt(o.Need, 10) + " tokens of KV cache (its prompt plus max_tokens, or one output token); the largest engine holds " +
			strconv.FormatInt(o.Limit, 10) + " (max_kv_tokens): shorten the prompt or lower max_tokens"
	case router.ShuttingDown:
		return "narwhal is shutting down; retry on another instance"
	}
	return "rejected"
}

// answerPlacement sends the routing headers: the destination Envoy's ORIGINAL_DST cluster reads,
// the prefiller or decoder the destination hands off to, the placement kind and request id.
func (st *stream) answerPlacement(p router.Placement) {
	c := &st.s.shared
	dest := p.DecodeAddr
	set := make([]*corev3.HeaderValueOption, 0, 4)
	if st.s.cfg.Handoff == config.HandoffPrefill && p.Kind == router.Disaggregated {
		dest = p.PrefillAddr
		set = append(set, c.header(wire.HeaderDecode, p.DecodeAddr))
	} else if p.Kind == router.Disaggregated {
		set = append(set, c.header(wire.HeaderPrefiller, p.PrefillAddr))
	}
	set = append(set,
		c.header(wire.HeaderDestination, dest),
		c.header(wire.HeaderPlacement, p.Kind.String()),
		setHeader(wire.HeaderRequestID, st.id),
	)
	mut := &extprocv3.HeaderMutation{SetHeaders: set}
	if st.strip != nil { // client-supplied headers that this placement does not overwrite
		mut.RemoveHeaders = removeExcept(st.strip.RemoveHeaders, set)
	}
	st.phase = phaseResponse
	st.reply(placementReply(mut, c.lbMetadata(dest), st.fullDuplex))
	if st.fullDuplex { // Envoy forwards only the body Narwhal sends back
		st.reply(echoRequestBody(st.body, true))
		st.body = nil
	}
}

func removeExcept(remove []string, set []*corev3.HeaderValueOption) []string {
	out := remove[:0:0]
next:
	for _, k := range remove {
		for _, s := range set {
			if s.Header.Key == k {
				continue next
			}
		}
		out = append(out, k)
	}
	return out
}

// responseHeaders learns the response's status and kind. A response that is not a success or
// not an event stream is settled now and its body skipped (mode_override) where Envoy allows.
func (st *stream) responseHeaders(h *extprocv3.HttpHeaders) {
	if !st.placed || st.phase != phaseResponse {
		st.reply(continueResponseHeaders(false))
		return
	}
	var code, ctype string
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch hv.GetKey() {
		case ":status":
			code = headerValue(hv)
		case "content-type":
			ctype = headerValue(hv)
		}
	}
	skip := !st.respDuplex // mode_override is refused in full duplex
	switch {
	case code != "200":
		why := router.FailRequest
		if len(code) == 3 && code[0] == '5' { // the engine failed it (or Envoy answered its reset)
			why = router.FailUpstream
		}
		st.settle(func() error { return st.s.placer.Fail(st.handle, why) })
		st.reply(continueResponseHeaders(skip))
	case !strings.HasPrefix(ctype, "text/event-stream") || h.GetEndOfStream():
		// A whole response at once: the engine has finished.
		st.settle(func() error { return st.s.placer.Complete(st.handle, 0) })
		st.reply(continueResponseHeaders(skip))
	default:
		st.phase = phaseStreaming
		st.reply(continueResponseHeaders(false))
	}
}

// responseBody observes a streamed response chunk: the first token, then the end with usage.
func (st *stream) responseBody(b *extprocv3.HttpBody) {
	if st.phase == phaseStreaming {
		st.obs.Write(b.GetBody())
		if st.firstAt.IsZero() && st.obs.FirstToken() {
			st.firstAt = st.s.now()
			_ = st.s.placer.FirstToken(st.handle)
			st.s.metrics.observeTTFT(st.projTTFT, st.firstAt.Sub(st.arrival).Seconds())
		}
		if b.GetEndOfStream() {
			st.finish()
		}
	}
	st.reply(continueResponseBody(b.GetBody(), b.GetEndOfStream(), st.respDuplex))
}

// finish settles a streamed response that reached its end.
func (st *stream) finish() {
	prompt, completion, ok := st.obs.Usage()
	if !ok {
		completion = st.obs.Events()
	} else if st.s.sizer != nil && prompt > 0 {
		st.s.sizer.ObserveRequest(&st.req, prompt)
	}
	if !st.firstAt.IsZero() && completion > 1 {
		st.s.metrics.observeTPOT(st.s.now().Sub(st.firstAt).Seconds() / float64(completion-1))
	}
	st.settle(func() error { return st.s.placer.Complete(st.handle, completion) })
}

// settle reports the request's end to the router once.
func (st *stream) settle(fn func() error) {
	st.phase = phaseDone
	st.placed = false
	_ = fn()
}

// close releases a placed request whose exchange ended before its response did: Envoy closed the
// stream because the client or the upstream reset it; ext_proc cannot tell which, so it counts
// as cancelled in flight.
func (st *stream) close() {
	if st.placed {
		_ = st.s.placer.Cancel(st.handle)
		st.placed = false
	}
}

func headerValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}
