package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// ErrStreamReset is returned by ProcessResponse when a local reply comes
// after the response has started downstream: Envoy resets the stream then.
var ErrStreamReset = errors.New("gateway: local reply after the response started: stream reset")

// Exchange drives the ext_proc stream of one HTTP request as Envoy's filter
// does. Call ProcessRequest, then (unless it produced a local reply)
// ProcessResponse, then Close. An Exchange is not safe for concurrent use:
// like Envoy's filter it runs on one goroutine (its stream reader aside).
type Exchange struct {
	c   *Client
	ctx context.Context

	// phase changes only through transition.
	phase Phase
	// awaiting is set while a reply to the last message sent is due.
	awaiting bool
	// deadline is the outstanding message's message_timeout; zero when none
	// runs (no message outstanding, or full duplex).
	deadline  time.Time
	callStart time.Time

	stream     extprocv3.ExternalProcessor_ProcessClient
	cancel     context.CancelFunc
	in         *inbox
	openedAt   time.Time
	closed     bool // closeStream ran
	sendBroken bool // Send failed: the stream's status comes from Recv

	req, resp direction
	rec       Record
	// forwarded is the request's filter metadata of the forwarding namespaces, sent in every
	// message's metadata_context.
	forwarded map[string]*structpb.Struct
}

// direction is one side of the filter (Envoy's DecodingProcessorState or
// EncodingProcessorState).
type direction struct {
	response     bool
	sendHeaders  bool
	bodyMode     extprocfilterv3.ProcessingMode_BodySendMode
	sendTrailers bool

	headers Headers
	// held: the headers have not left the filter yet, so a BUFFERED body
	// reply may still mutate them.
	held   bool
	noBody bool // end_of_stream was on the headers
	// bodyReceived: body data went to the processor (full duplex then
	// forbids failing open).
	bodyReceived bool
	bodyStart    time.Time

	// body is the BUFFERED body, or the STREAMED chunk awaiting its reply,
	// as mutated by the reply.
	body    []byte
	bodyEOS bool
	// out holds FULL_DUPLEX_STREAMED data released by streamed_response
	// replies, not yet handed on; outEOS is set by the last one.
	out    [][]byte
	outEOS bool
	// replaced: CONTINUE_AND_REPLACE put replacement in place of the body.
	replaced    bool
	replacement []byte
}

func (d *direction) setMode(pm *extprocfilterv3.ProcessingMode, response bool) {
	d.response = response
	if response {
		d.sendHeaders = pm.GetResponseHeaderMode() != extprocfilterv3.ProcessingMode_SKIP
		d.sendTrailers = pm.GetResponseTrailerMode() == extprocfilterv3.ProcessingMode_SEND
		d.bodyMode = pm.GetResponseBodyMode()
		return
	}
	d.sendHeaders = pm.GetRequestHeaderMode() != extprocfilterv3.ProcessingMode_SKIP
	d.sendTrailers = pm.GetRequestTrailerMode() == extprocfilterv3.ProcessingMode_SEND
	d.bodyMode = pm.GetRequestBodyMode()
}

// noExternalProcess is Envoy's noExternalProcess: nothing of this direction
// goes to the processor.
func (d *direction) noExternalProcess() bool {
	return !d.sendHeaders && d.bodyMode == None && !d.sendTrailers
}

// streamedBody: Envoy removes content-length in these modes, since it cannot
// keep it right when chunks are mutated.
func (d *direction) streamedBody() bool {
	return d.bodyMode == Streamed || d.bodyMode == FullDuplex
}

func (d *direction) headersPhase() Phase {
	if d.response {
		return PhaseResponseHeaders
	}
	return PhaseRequestHeaders
}

func (d *direction) bodyPhase() Phase {
	if d.response {
		return PhaseResponseBody
	}
	return PhaseRequestBody
}

func (d *direction) duplexPhase() Phase {
	if d.response {
		return PhaseResponseBodyDuplex
	}
	return PhaseRequestBodyDuplex
}

// Record returns a snapshot of what happened so far.
func (x *Exchange) Record() *Record {
	r := x.rec
	r.Phase = x.phase
	r.Violations = append([]Violation(nil), x.rec.Violations...)
	return &r
}

// Phase returns the current phase.
func (x *Exchange) Phase() Phase { return x.phase }

// Close ends the exchange as Envoy's onDestroy does: the stream, if still
// open, is half-closed and reset. A phase still awaiting a reply ends as
// cancelled. Close is idempotent.
func (x *Exchange) Close() {
	if !x.phase.Terminal() {
		if x.awaiting {
			x.rec.Cancelled = true
			x.finishCall()
			x.transition(PhaseCancelled)
		} else {
			x.transition(PhaseDone)
		}
	}
	x.closeStream()
}

// --- the state machine ---------------------------------------------------

// transitions lists the non-terminal moves; any non-terminal phase may also
// end in a terminal one.
var transitions = map[Phase][]Phase{
	PhaseIdle:               {PhaseRequestHeaders},
	PhaseRequestHeaders:     {PhaseRequestBody, PhaseRequestBodyDuplex, PhaseRequestDone},
	PhaseRequestBody:        {PhaseRequestBodyDuplex, PhaseRequestDone},
	PhaseRequestBodyDuplex:  {PhaseRequestDone},
	PhaseRequestDone:        {PhaseResponseHeaders, PhaseResponseBody, PhaseResponseBodyDuplex, PhaseResponseDone},
	PhaseResponseHeaders:    {PhaseResponseBody, PhaseResponseBodyDuplex, PhaseResponseDone},
	PhaseResponseBody:       {PhaseResponseBodyDuplex, PhaseResponseDone},
	PhaseResponseBodyDuplex: {PhaseResponseDone},
}

func validTransition(from, to Phase) bool {
	if from == to {
		return true
	}
	if from.Terminal() {
		return false
	}
	if to.Terminal() {
		return true
	}
	for _, p := range transitions[from] {
		if p == to {
			return true
		}
	}
	return false
}

// transition moves the exchange to phase to. An invalid move is a bug in
// this package, not in the server under test.
func (x *Exchange) transition(to Phase) {
	if !validTransition(x.phase, to) {
		panic(fmt.Sprintf("gateway: invalid phase transition %v → %v", x.phase, to))
	}
	x.phase = to
}

// done reports Envoy's processing_complete_: the processor is no longer
// used for this request.
func (x *Exchange) done() bool { return x.phase.Terminal() }

// stopped reports that the request itself ended: a local reply, or the
// client went away.
func (x *Exchange) stopped() bool {
	return x.phase == PhaseLocalReply || x.phase == PhaseCancelled
}

func (x *Exchange) violate(kind ViolationKind, detail string) {
	x.rec.Violations = append(x.rec.Violations, Violation{Kind: kind, Phase: x.phase, Detail: detail})
}

// startCall notes that a reply to the message about to be sent is due in
// phase p and arms message_timeout, except in full duplex (Envoy's
// onStartProcessorCall).
func (x *Exchange) startCall(p Phase, d *direction) {
	x.transition(p)
	x.awaiting = true
	x.callStart = time.Now()
	if d.bodyMode != FullDuplex {
		x.deadline = x.callStart.Add(x.c.mode.messageTimeout())
	} else {
		x.deadline = time.Time{}
	}
}

// finishCall notes that the due reply arrived (Envoy's
// onFinishProcessorCall) and returns how long it took.
func (x *Exchange) finishCall() time.Duration {
	if !x.awaiting {
		return 0
	}
	x.awaiting = false
	x.deadline = time.Time{}
	return since(x.callStart)
}

// --- the stream -----------------------------------------------------------

// open starts the stream on first use. It reports false when the stream
// could not be opened (the exchange then ended).
func (x *Exchange) open() bool {
	if x.stream != nil {
		return true
	}
	ctx, cancel := context.WithCancel(x.ctx)
	stream, err := x.c.epc.Process(ctx)
	if err != nil {
		cancel()
		x.closed = true
		if x.ctx.Err() != nil {
			x.onCancel()
			return false
		}
		x.onStreamError(err)
		return false
	}
	x.stream, x.cancel, x.openedAt = stream, cancel, time.Now()
	x.in = newInbox()
	go x.in.receive(stream)
	return true
}

// send puts one message on the stream, opening it first; the first message
// carries protocol_config as Envoy's encodeProtocolConfig does.
func (x *Exchange) send(req *extprocv3.ProcessingRequest) {
	if x.done() || !x.open() {
		return
	}
	req.MetadataContext = &corev3.Metadata{FilterMetadata: x.forwarded}
	if !x.rec.ProtocolConfigSent {
		req.ProtocolConfig = &extprocv3.ProtocolConfiguration{
			RequestBodyMode:  x.req.bodyMode,
			ResponseBodyMode: x.resp.bodyMode,
		}
		x.rec.ProtocolConfigSent = true
	}
	if x.sendBroken {
		return
	}
	x.rec.Sent++
	if err := x.stream.Send(req); err != nil {
		// io.EOF: the server ended the stream; its status (and any reply
		// sent before) is read from the inbox.
		x.sendBroken = true
		if err != io.EOF && x.ctx.Err() != nil {
			x.onCancel()
		}
	}
}

// closeStream half-closes and resets the stream, as Envoy's close() does,
// and waits for the stream reader to stop.
func (x *Exchange) closeStream() {
	if x.closed {
		return
	}
	x.closed = true
	if x.stream == nil {
		return
	}
	_ = x.stream.CloseSend()
	x.cancel()
	<-x.in.exited
	x.rec.Timings.Stream = since(x.openedAt)
}

type eventKind int

const (
	evReply eventKind = iota
	evStreamEnd
	evTimeout
	evCancel
	evChunk
)

type event struct {
	kind  eventKind
	reply *extprocv3.ProcessingResponse
	err   error
	chunk bodyChunk
}

// wait blocks until the next event: a queued reply, the end of the stream,
// message_timeout, cancellation, or (when src is not nil) a body chunk.
func (x *Exchange) wait(src <-chan bodyChunk) event {
	for {
		var signal <-chan struct{}
		if x.in != nil && !x.closed {
			r, ended, err := x.in.next()
			switch {
			case r != nil:
				return event{kind: evReply, reply: r}
			case ended:
				return event{kind: evStreamEnd, err: err}
			}
			signal = x.in.signal
		}
		var timeout <-chan time.Time
		var timer *time.Timer
		if !x.deadline.IsZero() {
			d := time.Until(x.deadline)
			if d <= 0 {
				return event{kind: evTimeout}
			}
			timer = time.NewTimer(d)
			timeout = timer.C
		}
		var ev *event
		select {
		case <-signal:
		case <-timeout:
			ev = &event{kind: evTimeout}
		case <-x.ctx.Done():
			ev = &event{kind: evCancel}
		case c := <-src:
			ev = &event{kind: evChunk, chunk: c}
		}
		if timer != nil {
			timer.Stop()
		}
		if ev != nil {
			return *ev
		}
	}
}

// dispatch handles one stream event.
func (x *Exchange) dispatch(ev event) {
	switch ev.kind {
	case evReply:
		x.onReply(ev.reply)
	case evStreamEnd:
		x.onStreamEnd(ev.err)
	case evTimeout:
		x.onMessageTimeout()
	case evCancel:
		x.onCancel()
	}
}

// await handles events until the due reply arrived or the exchange ended.
func (x *Exchange) await() {
	for x.awaiting && !x.done() {
		x.dispatch(x.wait(nil))
	}
}

// pump handles what the server sent while nothing was due, without
// blocking: Envoy handles such messages as they arrive.
func (x *Exchange) pump() {
	for x.in != nil && !x.closed && !x.done() {
		r, ended, err := x.in.next()
		switch {
		case r != nil:
			x.onReply(r)
		case ended:
			x.onStreamEnd(err)
		default:
			return
		}
	}
	if !x.done() && x.ctx.Err() != nil {
		x.onCancel()
	}
}

// --- how an exchange ends -------------------------------------------------

// failureModeAllow is Envoy's failureModeAllow(): fail-open, unless a full
// duplex body has already gone to the processor.
func (x *Exchange) failureModeAllow() bool {
	if (x.req.bodyMode == FullDuplex && x.req.bodyReceived) ||
		(x.resp.bodyMode == FullDuplex && x.resp.bodyReceived) {
		return false
	}
	return x.c.mode.FailureModeAllow
}

// localReply ends the request with a reply Envoy sends itself.
func (x *Exchange) localReply(lr *LocalReply) {
	x.finishCall()
	x.closeStream()
	lr.Phase = x.phase
	x.rec.LocalReply = lr
	x.transition(PhaseLocalReply)
}

// envoyError is Envoy's own error reply (handleErrorResponse, onGrpcError,
// onMessageTimeout, buffer overflow).
func (x *Exchange) envoyError(status int, details, body string) {
	lr := &LocalReply{Status: status, Details: responseCodeDetails(details)}
	if body != "" {
		lr.Body = []byte(body)
		lr.Headers = Headers{{Key: "content-type", Value: "text/plain"}}
	}
	x.localReply(lr)
}

// bypass drops the processor for the rest of the request (Envoy's
// clearAsyncState with processing_complete_): what is pending continues
// unprocessed.
func (x *Exchange) bypass(reason string) {
	x.finishCall()
	x.closeStream()
	x.rec.Bypassed = reason
	x.transition(PhaseBypassed)
}

// finish closes the stream after the last expected reply (Envoy's
// closeGrpcStreamIfLastRespReceived): the rest flows unprocessed.
func (x *Exchange) finish() {
	x.finishCall()
	x.closeStream()
	x.transition(PhaseDone)
}

// onCancel: the downstream client went away; Envoy destroys the filter,
// which resets the stream.
func (x *Exchange) onCancel() {
	x.rec.Cancelled = true
	if x.done() {
		x.closeStream()
		return
	}
	x.finishCall()
	x.closeStream()
	x.transition(PhaseCancelled)
}

// onMessageTimeout is Envoy's onMessageTimeout.
func (x *Exchange) onMessageTimeout() {
	x.violate(MessageTimeout, fmt.Sprintf("no reply within %v", x.c.mode.messageTimeout()))
	if x.failureModeAllow() {
		x.bypass("message_timeout with failure_mode_allow")
		return
	}
	x.envoyError(504, "ext_proc_error_per-message_timeout_exceeded", "")
}

// onStreamEnd handles the server ending the stream (Envoy's onGrpcClose
// and onGrpcError).
func (x *Exchange) onStreamEnd(err error) {
	if x.ctx.Err() != nil {
		// The stream ended because the request's context did: the
		// client went away first.
		x.onCancel()
		return
	}
	if err == io.EOF || status.Code(err) == codes.OK {
		if x.phase == PhaseResponseDone {
			x.finish()
			return
		}
		x.violate(ServerClosed, "stream ended with OK while the filter still expected replies")
		x.bypass("server closed the stream")
		return
	}
	x.onStreamError(err)
}

func (x *Exchange) onStreamError(err error) {
	st := status.Convert(err)
	x.violate(StreamError, fmt.Sprintf("%v: %s", st.Code(), st.Message()))
	if x.failureModeAllow() {
		x.bypass("gRPC error with failure_mode_allow")
		return
	}
	x.envoyError(500, fmt.Sprintf("ext_proc_error_gRPC_error_%d{%s}", int(st.Code()), st.Message()), "")
}

// responseCodeDetails replaces whitespace by '_' as Envoy's
// StringUtil::replaceAllEmptySpace does for local reply details.
func responseCodeDetails(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsSpace(r) {
			return '_'
		}
		return r
	}, s)
}

// --- fields shared by every reply ---------------------------------------

// applyMetadata keeps dynamic_metadata for the namespaces the filter
// receives and drops the rest (Envoy's setDynamicMetadata). Envoy merges a
// namespace's fields into what it already holds.
func (x *Exchange) applyMetadata(r *extprocv3.ProcessingResponse) {
	for ns := range r.GetTypedDynamicMetadata() {
		x.violate(MetadataNotReceived, "typed_dynamic_metadata["+ns+"]")
	}
	md := r.GetDynamicMetadata()
	if md == nil {
		return
	}
	for ns, v := range md.GetFields() {
		if !x.c.mode.receives(ns) {
			x.violate(MetadataNotReceived, "dynamic_metadata["+ns+"]: namespace not in receiving_namespaces")
			continue
		}
		if x.rec.DynamicMetadata == nil {
			x.rec.DynamicMetadata = map[string]*structpb.Struct{}
		}
		dst := x.rec.DynamicMetadata[ns]
		if dst == nil {
			dst = &structpb.Struct{Fields: map[string]*structpb.Value{}}
			x.rec.DynamicMetadata[ns] = dst
		}
		for k, fv := range v.GetStructValue().GetFields() {
			dst.Fields[k] = fv
		}
	}
}

// applyModeOverride honours mode_override as Envoy does: only with
// allow_mode_override, no full-duplex body mode configured, and while a
// headers reply is due; header and trailer modes left DEFAULT keep the
// configuration, body modes are literal. Envoy applies it before looking at
// the reply's type.
func (x *Exchange) applyModeOverride(r *extprocv3.ProcessingResponse) {
	mo := r.GetModeOverride()
	if mo == nil {
		return
	}
	m := x.c.mode
	switch {
	case !m.AllowModeOverride:
		x.violate(ModeOverrideIgnored, "allow_mode_override is false")
	case m.RequestBody == FullDuplex || m.ResponseBody == FullDuplex:
		x.violate(ModeOverrideIgnored, "a body mode is FULL_DUPLEX_STREAMED")
	case !x.awaiting || (x.phase != PhaseRequestHeaders && x.phase != PhaseResponseHeaders):
		x.violate(ModeOverrideIgnored, "not in a reply to headers")
	default:
		eff := effectiveOverride(mo, x.c.base)
		x.req.setMode(eff, false)
		x.resp.setMode(eff, true)
		x.rec.ModeOverrides++
	}
}

// clearRouteCache counts clear_route_cache only on the request path and only
// with a header mutation in the same reply.
func (x *Exchange) clearRouteCache(d *direction, cr *extprocv3.CommonResponse) {
	if !cr.GetClearRouteCache() {
		return
	}
	switch {
	case d.response:
		x.violate(RouteCacheClearIgnored, "clear_route_cache on the response path")
	case cr.GetHeaderMutation() == nil:
		x.violate(RouteCacheClearIgnored, "clear_route_cache without header_mutation in the same reply")
	default:
		x.rec.RouteCacheCleared = true
	}
}
