package extproc

import (
	"context"
	"log/slog"
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

// phase is where one request is in its ext_proc exchange: the stream's only lifecycle state.
// It only moves forward, and only through stream.to.
type phase uint8

const (
	phaseHeaders   phase = iota // waiting for request headers
	phaseBody                   // reading the request body of a routed request
	phasePassing                // not routed: the exchange passes through untouched
	phasePlaced                 // placed: waiting for the response headers
	phaseStreaming              // placed: observing the streamed response body
	phaseSettled                // the request's end was reported to the router; the rest passes
	phaseAnswered               // Narwhal answered the request itself, or the exchange broke: no message may follow
)

// holds reports whether the request holds a placement the router must hear the end of.
func (p phase) holds() bool { return p == phasePlaced || p == phaseStreaming }

// seen records which parts of the HTTP exchange Envoy has sent on the stream.
type seen uint8

const (
	seenRequestHeaders seen = 1 << iota
	seenRequestEnd          // the request ended: end_of_stream, or its trailers
	seenResponseHeaders
	seenResponseEnd
	seenResponseTrailers
)

// stream is one request's ext_proc exchange: its phase, and one small struct per concern.
type stream struct {
	s     *Server
	ctx   context.Context
	phase phase
	x     exchange
	req   request
	pl    placement
	resp  observation
}

// exchange is the protocol's state: what Envoy has sent, the body modes it announced, and the
// replies to the current message.
type exchange struct {
	seen           seen
	fullDuplex     bool          // request body mode FULL_DUPLEX_STREAMED
	respDuplex     bool          // response body mode FULL_DUPLEX_STREAMED
	refuseStreamed bool          // request body mode STREAMED: no body-based placement possible
	waited         time.Duration // time spent in the waiting set during this message
	out            []*extprocv3.ProcessingResponse
}

// request is what the request showed before its placement.
type request struct {
	routed, chat bool
	subset       []string // the gateway's subset hint (wire.SubsetKey); nil without one
	id           string
	arrival      time.Time
	strip        *extprocv3.HeaderMutation // client routing headers to remove
	body         []byte                    // full-duplex request body being gathered
	parsed       Request
}

// placement is the router's answer, while the request holds it (phase.holds).
type placement struct {
	handle   router.Handle
	projTTFT float64
}

// observation is what the response has shown.
type observation struct {
	obs     ResponseObserver
	firstAt time.Time
	whole   bool // a whole JSON response observed for its usage only (no first token of its own)
}

// to moves the request to phase p; phases only move forward.
func (st *stream) to(p phase) {
	if p > st.phase {
		st.phase = p
	}
}

func newStream(s *Server, ctx context.Context) *stream {
	return &stream{s: s, ctx: ctx}
}

// step handles one message from Envoy and returns the replies to send, in order. A message that
// does not fit the exchange so far (order) is a protocol violation: step returns it as an
// error, after releasing what the request held, and the stream must end.
func (st *stream) step(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
	st.x.out = st.x.out[:0]
	if what := st.order(req); what != "" {
		if st.phase.holds() { // the exchange broke: the request failed, through no fault of the engine
			st.settle("fail", st.s.placer.Fail(st.pl.handle, router.FailRequest))
		}
		st.to(phaseAnswered)
		st.s.metrics.protocolError()
		return nil, &ProtocolError{What: what}
	}
	start := st.s.now()
	if pc := req.GetProtocolConfig(); pc != nil {
		st.x.fullDuplex = pc.GetRequestBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		st.x.respDuplex = pc.GetResponseBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		if pc.GetRequestBodyMode() == filterv3.ProcessingMode_STREAMED {
			st.x.refuseStreamed = true
		}
	}
	var name string
	switch r := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		name = "request_headers"
		st.req.subset = subsetHint(req.GetMetadataContext())
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
	st.s.metrics.observePhase(name, st.s.now().Sub(start)-st.x.waited)
	st.x.waited = 0
	return st.x.out, nil
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
	has := func(s seen) bool { return st.x.seen&s != 0 }
	if st.phase == phaseAnswered {
		return "a message after Narwhal answered the request itself"
	}
	var eos bool
	switch r := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if has(seenRequestHeaders) {
			return "request_headers a second time"
		}
		st.x.seen |= seenRequestHeaders
		eos = r.RequestHeaders.GetEndOfStream()
		if eos {
			st.x.seen |= seenRequestEnd
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
			st.x.seen |= seenRequestEnd
		}
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if has(seenRequestEnd) {
			return "request_trailers after the request ended"
		}
		st.x.seen |= seenRequestEnd
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		switch {
		case has(seenResponseHeaders):
			return "response_headers a second time"
		case st.phase == phaseHeaders || st.phase == phaseBody:
			return "response_headers before the request was answered"
		}
		st.x.seen |= seenResponseHeaders
		if r.ResponseHeaders.GetEndOfStream() {
			st.x.seen |= seenResponseEnd
		}
	case *extprocv3.ProcessingRequest_ResponseBody:
		switch {
		case !has(seenResponseHeaders):
			return "response_body before response_headers"
		case has(seenResponseEnd):
			return "response_body after the response ended"
		}
		if r.ResponseBody.GetEndOfStream() {
			st.x.seen |= seenResponseEnd
		}
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		switch {
		case !has(seenResponseHeaders):
			return "response_trailers before response_headers"
		case has(seenResponseTrailers):
			return "response_trailers a second time"
		}
		st.x.seen |= seenResponseTrailers | seenResponseEnd
	}
	return ""
}

func (st *stream) reply(r *extprocv3.ProcessingResponse) { st.x.out = append(st.x.out, r) }

// reject answers the request with an ImmediateResponse, which ends the exchange.
func (st *stream) reject(r rejection, details string) {
	st.reply(immediate(r, details))
	st.to(phaseAnswered)
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
	st.req.routed, st.req.chat = st.s.routed(path)
	if !st.req.routed {
		st.passThrough(path, mut)
		return
	}
	st.req.id = st.s.requestID(envoyID)
	st.req.arrival = st.s.now()
	if st.x.refuseStreamed {
		st.reject(rejection{status: 500, code: "unsupported_body_mode",
			message: "narwhal: request_body_mode STREAMED cannot carry a body-based placement; configure BUFFERED or FULL_DUPLEX_STREAMED"},
			"narwhal_streamed_request_body_mode")
		return
	}
	st.req.strip = mut
	if h.GetEndOfStream() { // no body at all
		st.offer(nil)
		return
	}
	st.to(phaseBody)
	if !st.x.fullDuplex {
		st.reply(continueRequestHeaders(mut))
	}
}

// subsetHint reads the Gateway API Inference Extension's subset hint from an ext_proc request's
// metadata: namespace wire.SubsetNamespace, key wire.SubsetKey, a list of IP:port (or one
// comma-separated string). nil when there is none; an empty hint is empty, not nil.
func subsetHint(md *corev3.Metadata) []string {
	ns, ok := md.GetFilterMetadata()[wire.SubsetNamespace]
	if !ok {
		return nil
	}
	v, ok := ns.GetFields()[wire.SubsetKey]
	if !ok {
		return nil
	}
	out := []string{}
	add := func(s string) {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	if l := v.GetListValue(); l != nil {
		for _, e := range l.GetValues() {
			add(e.GetStringValue())
		}
	} else {
		for _, s := range strings.Split(v.GetStringValue(), ",") {
			add(s)
		}
	}
	return out
}

// passThrough sends a request outside router.paths on untouched but for its destination: the
// engine the router picks for it (router.PassThrough), named as a placement names its engine,
// so that behind a gateway whose every request goes through Narwhal (the Gateway API Inference
// Extension's) /v1/models, /v1/embeddings or /health reach an engine. With no live engine it
// goes on without one (the route decides), unless the gateway's subset hint named engines:
// then 503 subset_unavailable, as for a placed request.
func (st *stream) passThrough(path string, mut *extprocv3.HeaderMutation) {
	st.to(phasePassing)
	addr, ok := st.s.placer.PassThrough(passKind(path), st.req.subset)
	switch {
	case !ok && st.req.subset != nil: // the gateway's subset names no live engine: the protocol's 503
		c := router.SubsetUnavailable
		st.reject(rejection{status: c.Status(), code: c.String(), message: rejectMessage(router.Outcome{Code: c})}, "narwhal_"+c.String())
		return
	case !ok:
		st.reply(continueRequestHeaders(mut))
		return
	}
	if mut == nil {
		mut = &extprocv3.HeaderMutation{}
	}
	c := &st.s.shared
	mut.SetHeaders = append(mut.SetHeaders, c.header(wire.HeaderDestination, addr))
	st.reply(placementReply(mut, c.lbMetadata(addr), true))
}

// requestBody reads the body: BUFFERED sends it whole; full duplex in chunks, gathered here.
func (st *stream) requestBody(b *extprocv3.HttpBody) {
	if st.phase != phaseBody { // a passed-through request's body
		if st.x.fullDuplex { // Envoy forwards only what comes back
			st.reply(echoRequestBody(b.GetBody(), b.GetEndOfStream()))
			return
		}
		st.reply(requestBodyContinue)
		return
	}
	if !st.x.fullDuplex {
		body := b.Body
		b.Body = nil // Envoy keeps the buffered body: a waiting request does not hold it here
		st.offer(body)
		return
	}
	// Gathered up to one byte past the limit: enough for ParseRequest to answer 413.
	if keep := int(st.s.cfg.BodyLimitBytes) + 1 - len(st.req.body); keep > 0 {
		st.req.body = append(st.req.body, b.GetBody()[:min(keep, len(b.GetBody()))]...)
	}
	if b.GetEndOfStream() {
		st.offer(st.req.body)
	}
}

// requestTrailers ends a full-duplex body that was not ended by its last chunk.
func (st *stream) requestTrailers() {
	if st.phase == phaseBody && st.x.fullDuplex {
		st.offer(st.req.body)
		if st.phase == phaseAnswered {
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

// parse reads the request into st.req.parsed, or answers 413/400 (ParseRequest's verdict) and
// reports false.
func (st *stream) parse(body []byte) bool {
	req, perr := ParseRequest(body, st.req.chat, st.s.parse)
	if perr != nil {
		st.s.placer.Invalid()
		details := "narwhal_invalid_request"
		if perr.Code == CodeBodyTooLarge {
			details = "narwhal_body_too_large"
		}
		st.reject(rejection{status: perr.Status, code: perr.Code, message: perr.Message}, details)
		return false
	}
	st.req.parsed = req
	return true
}

// place offers the parsed request to the router and answers with its outcome.
func (st *stream) place() {
	req := &st.req.parsed
	waitStart := st.s.now()
	out, err := st.s.placer.Offer(st.ctx, router.Offer{
		ID: st.req.id, PromptTokens: req.PromptTokens, MaxTokens: req.MaxTokens, NonStreaming: !req.Stream, Prefix: req.PrefixHashes(),
		Subset: st.req.subset,
	})
	if out.Status != router.Dispatched || err != nil {
		st.x.waited = st.s.now().Sub(waitStart)
	}
	switch {
	case err != nil: // the client went away while waiting; Offer released it
		st.to(phaseAnswered)
	case out.Status == router.Rejected:
		st.reject(rejection{status: out.Code.Status(), code: out.Code.String(), message: rejectMessage(out), retryAfter: out.RetryAfterS},
			"narwhal_"+out.Code.String())
	default:
		st.pl = placement{handle: out.Handle, projTTFT: out.Placement.ProjectedTTFT}
		st.s.metrics.observeWait(st.x.waited)
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
	case router.SubsetUnavailable:
		return "no engine of the gateway's subset hint (x-gateway-destination-endpoint-subset) is live and able to serve the request"
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
	kind := p.Kind
	if kind == router.Local {
		kind = router.Aggregate // both phases on one engine: the header's two values (README)
	}
	set = append(set,
		c.header(wire.HeaderDestination, dest),
		c.header(wire.HeaderPlacement, kind.String()),
		setHeader(wire.HeaderRequestID, st.req.id),
	)
	mut := &extprocv3.HeaderMutation{SetHeaders: set}
	if st.req.strip != nil { // client-supplied headers that this placement does not overwrite
		mut.RemoveHeaders = removeExcept(st.req.strip.RemoveHeaders, set)
	}
	st.to(phasePlaced)
	if st.s.log.Enabled(st.ctx, slog.LevelDebug) { // which path and why (router.local_prefill)
		st.s.log.Debug("placed", "request_id", st.req.id, "path", p.Kind.String(), "prefill", p.Prefill, "decode", p.Decode,
			"projected_ttft_s", p.ProjectedTTFT, "why", p.Why.String(), "other_path_ttft_s", p.OtherTTFT)
	}
	st.reply(placementReply(mut, c.lbMetadata(dest), st.x.fullDuplex))
	if st.x.fullDuplex { // Envoy forwards only the body Narwhal sends back
		st.reply(echoRequestBody(st.req.body, true))
		st.req.body = nil
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
	if st.phase != phasePlaced {
		st.reply(continueResponseHeaders(false))
		return
	}
	var code, ctype, clen string
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch hv.GetKey() {
		case ":status":
			code = headerValue(hv)
		case "content-type":
			ctype = headerValue(hv)
		case "content-length":
			clen = headerValue(hv)
		}
	}
	skip := !st.x.respDuplex // mode_override is refused in full duplex
	switch {
	case code != "200":
		why := router.FailRequest
		if len(code) == 3 && code[0] == '5' { // the engine failed it (or Envoy answered its reset)
			why = router.FailUpstream
			if h.GetEndOfStream() || clen == "0" { // no body: which leg failed is the router's call
				why = router.FailUpstreamNoBody
			}
		}
		st.settle("fail", st.s.placer.Fail(st.pl.handle, why))
		st.reply(continueResponseHeaders(skip))
	case !h.GetEndOfStream() && strings.HasPrefix(ctype, "application/json") && st.s.sizer != nil && st.s.sizer.Method() == config.SizingBytes:
		// A whole JSON response: it carries usage whether the client asked or not (vLLM's), and
		// the bytes sizing calibrates from it; settled at its end.
		st.resp.whole = true
		st.resp.obs.SetStreaming(false)
		st.to(phaseStreaming)
		st.reply(continueResponseHeaders(false))
	case !strings.HasPrefix(ctype, "text/event-stream") || h.GetEndOfStream():
		// A whole response at once: the engine has finished.
		st.settle("complete", st.s.placer.Complete(st.pl.handle, 0))
		st.reply(continueResponseHeaders(skip))
	default:
		st.to(phaseStreaming)
		st.reply(continueResponseHeaders(false))
	}
}

// responseBody observes a streamed response chunk: the first token, then the end with usage.
func (st *stream) responseBody(b *extprocv3.HttpBody) {
	if st.phase == phaseStreaming {
		r := &st.resp
		r.obs.Write(b.GetBody())
		if r.firstAt.IsZero() && !r.whole && r.obs.FirstToken() {
			r.firstAt = st.s.now()
			st.s.routerErr(st.req.id, "first_token", st.s.placer.FirstToken(st.pl.handle))
			st.s.metrics.observeTTFT(st.pl.projTTFT, r.firstAt.Sub(st.req.arrival).Seconds())
		}
		if b.GetEndOfStream() {
			st.finish()
		}
	}
	st.reply(continueResponseBody(b.GetBody(), b.GetEndOfStream(), st.x.respDuplex))
}

// finish settles a streamed response that reached its end.
func (st *stream) finish() {
	r := &st.resp
	prompt, completion, ok := r.obs.Usage()
	if !ok {
		completion = r.obs.Events()
	} else if st.s.sizer != nil && prompt > 0 {
		st.s.sizer.ObserveRequest(&st.req.parsed, prompt)
	}
	if !r.firstAt.IsZero() && completion > 1 {
		st.s.metrics.observeTPOT(st.s.now().Sub(r.firstAt).Seconds() / float64(completion-1))
	}
	st.settle("complete", st.s.placer.Complete(st.pl.handle, completion))
}

// settle marks the request's end reported to the router (the call that reported it, op,
// returned err).
func (st *stream) settle(op string, err error) {
	st.to(phaseSettled)
	st.s.routerErr(st.req.id, op, err)
}

// close releases a placed request whose exchange ended before its response did: Envoy closed the
// stream because the client or the upstream reset it; ext_proc cannot tell which, so it counts
// as cancelled in flight.
func (st *stream) close() {
	if st.phase.holds() {
		st.settle("cancel", st.s.placer.Cancel(st.pl.handle))
	}
}

func headerValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}
