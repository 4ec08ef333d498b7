package gateway

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// onReply handles one reply as Envoy's Filter::onReceiveMessage does: a
// timeout override first, then mode_override, then one handler per reply
// type; spurious replies and rejected mutations end the request.
func (x *Exchange) onReply(r *extprocv3.ProcessingResponse) {
	x.rec.Received++
	if r.GetOverrideMessageTimeout() != nil {
		// With Envoy's default max_message_timeout (0) every override is
		// out of range; Envoy returns before looking at the rest.
		x.violate(TimeoutOverrideIgnored, "max_message_timeout is 0: the whole reply is ignored")
		return
	}
	x.applyModeOverride(r)

	var last bool
	var err error
	switch v := r.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		x.applyMetadata(r)
		last, err = x.onRequestHeadersReply(v.RequestHeaders)
	case *extprocv3.ProcessingResponse_RequestBody:
		x.applyMetadata(r)
		last, err = x.onRequestBodyReply(v.RequestBody)
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		x.applyMetadata(r)
		last, err = x.onResponseHeadersReply(v.ResponseHeaders)
	case *extprocv3.ProcessingResponse_ResponseBody:
		x.applyMetadata(r)
		last, err = x.onResponseBodyReply(v.ResponseBody)
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		x.applyMetadata(r)
		x.onImmediateResponse(v.ImmediateResponse)
		return
	case *extprocv3.ProcessingResponse_RequestTrailers, *extprocv3.ProcessingResponse_ResponseTrailers:
		// The client never sends trailers, so no trailers reply is due.
		x.applyMetadata(r)
		err = spurious("spurious message")
	default:
		err = spurious("unhandled message")
	}

	var fatal errFatal
	switch {
	case err == nil:
		if last {
			x.finish()
		}
	case isSpurious(err):
		x.violate(Spurious, fmt.Sprintf("%s reply: %v", replyKind(r), err))
		if x.failureModeAllow() {
			x.bypass("spurious reply with failure_mode_allow")
			return
		}
		x.envoyError(500, err.Error(), "")
	case errors.As(err, &fatal):
		x.violate(fatal.kind, fatal.msg)
		x.envoyError(500, fatal.msg, "")
	default:
		x.envoyError(500, err.Error(), "")
	}
}

// onRequestHeadersReply is the decoding state's handleHeadersResponse. It
// reports whether this was the last reply the filter expects.
func (x *Exchange) onRequestHeadersReply(hr *extprocv3.HeadersResponse) (last bool, err error) {
	d := &x.req
	if x.phase != PhaseRequestHeaders || !x.awaiting {
		return false, spurious("spurious message")
	}
	if err := x.onHeadersReply(d, hr.GetResponse()); err != nil {
		return false, err
	}
	x.rec.Timings.RequestHeaders = x.finishCall()
	x.afterHeadersReply(d)
	last = (d.noBody || (d.bodyMode == None && !d.sendTrailers)) && x.resp.noExternalProcess()
	return last, nil
}

// onResponseHeadersReply is the encoding state's handleHeadersResponse.
func (x *Exchange) onResponseHeadersReply(hr *extprocv3.HeadersResponse) (last bool, err error) {
	d := &x.resp
	if x.phase != PhaseResponseHeaders || !x.awaiting {
		return false, spurious("spurious message")
	}
	if err := x.onHeadersReply(d, hr.GetResponse()); err != nil {
		return false, err
	}
	x.rec.Timings.ResponseHeaders = x.finishCall()
	x.afterHeadersReply(d)
	last = d.noBody || (d.bodyMode == None && !d.sendTrailers)
	return last, nil
}

// onHeadersReply applies a headers reply's header mutation, route-cache
// clearing and CONTINUE_AND_REPLACE.
func (x *Exchange) onHeadersReply(d *direction, cr *extprocv3.CommonResponse) error {
	replace := cr.GetStatus() == extprocv3.CommonResponse_CONTINUE_AND_REPLACE
	rules := mutationRules{replacing: replace, skipContentLength: d.streamedBody()}
	if err := applyHeaderMutation(cr.GetHeaderMutation(), &d.headers, rules, x.violate); err != nil {
		return err
	}
	x.clearRouteCache(d, cr)
	if replace {
		if bm := cr.GetBodyMutation(); bm != nil {
			d.headers.Del("content-length")
			d.replaced = true
			d.replacement = applyBodyMutation(bm, nil)
		}
		d.bodyMode, d.sendTrailers = None, false
	}
	return nil
}

// afterHeadersReply moves on from a headers reply: full duplex now awaits
// the streamed body; every mode but BUFFERED lets the headers go on.
func (x *Exchange) afterHeadersReply(d *direction) {
	if d.bodyMode == FullDuplex && !d.noBody {
		// Streamed chunks are due only for body already sent; sendBody
		// marks the rest due as it goes.
		x.transition(d.duplexPhase())
		x.awaiting = d.bodyReceived
	}
	if d.bodyMode != Buffered || d.noBody {
		d.held = false
	}
}

// onRequestBodyReply is the decoding state's handleBodyResponse.
func (x *Exchange) onRequestBodyReply(br *extprocv3.BodyResponse) (last bool, err error) {
	d := &x.req
	if !x.awaiting || (x.phase != PhaseRequestBody && x.phase != PhaseRequestBodyDuplex) {
		return false, spurious("spurious message")
	}
	last, err = x.onBodyReply(d, br.GetResponse())
	return last && x.resp.noExternalProcess(), err
}

// onResponseBodyReply is the encoding state's handleBodyResponse.
func (x *Exchange) onResponseBodyReply(br *extprocv3.BodyResponse) (last bool, err error) {
	d := &x.resp
	if !x.awaiting || (x.phase != PhaseResponseBody && x.phase != PhaseResponseBodyDuplex) {
		return false, spurious("spurious message")
	}
	return x.onBodyReply(d, br.GetResponse())
}

// onBodyReply dispatches a body reply by body mode.
func (x *Exchange) onBodyReply(d *direction, cr *extprocv3.CommonResponse) (last bool, err error) {
	switch {
	case d.bodyMode == Buffered:
		err = x.onBufferedBodyReply(d, cr)
	case cr.GetBodyMutation().GetStreamedResponse() != nil:
		if d.bodyMode != FullDuplex {
			return false, spurious("spurious message: streamed_response is received while body_mode_ is not FULL_DUPLEX_STREAMED")
		}
		last = x.onDuplexBodyReply(d, cr)
	case d.bodyMode == FullDuplex:
		return false, spurious("spurious message: Normal body mutation response is received while body_mode_ is FULL_DUPLEX_STREAMED")
	default:
		last = x.onStreamedBodyReply(d, cr)
	}
	if err != nil {
		return false, err
	}
	x.clearRouteCache(d, cr)
	return last, nil
}

// onBufferedBodyReply: header mutations apply to the held headers; a body
// mutation must match a content-length header. Envoy keeps the stream open
// after a BUFFERED body reply.
func (x *Exchange) onBufferedBodyReply(d *direction, cr *extprocv3.CommonResponse) error {
	if cr.GetHeaderMutation() != nil {
		if !d.held {
			x.violate(HeaderMutationIgnored, "header_mutation after the headers went on")
		} else if err := applyHeaderMutation(cr.GetHeaderMutation(), &d.headers, mutationRules{replacing: cr.GetStatus() == extprocv3.CommonResponse_CONTINUE_AND_REPLACE}, x.violate); err != nil {
			return err
		}
	}
	if bm := cr.GetBodyMutation(); bm != nil {
		if cl := d.headers.Get("content-length"); d.held && cl != "" {
			if n, err := strconv.Atoi(cl); err == nil && n != len(bm.GetBody()) {
				return errFatal{ContentLengthMismatch, "mismatch between content length and the length of the mutated body"}
			}
		}
		d.body = applyBodyMutation(bm, d.body)
	}
	x.addBodyTiming(d, x.finishCall())
	d.held = false
	return nil
}

// onStreamedBodyReply answers the one outstanding STREAMED chunk; header
// mutations are not applied (the headers have gone on).
func (x *Exchange) onStreamedBodyReply(d *direction, cr *extprocv3.CommonResponse) (last bool) {
	if cr.GetHeaderMutation() != nil {
		x.violate(HeaderMutationIgnored, "header_mutation in a STREAMED body reply")
	}
	if bm := cr.GetBodyMutation(); bm != nil {
		d.body = applyBodyMutation(bm, d.body)
	}
	x.addBodyTiming(d, x.finishCall())
	return d.bodyEOS
}

// onDuplexBodyReply releases one streamed_response chunk.
func (x *Exchange) onDuplexBodyReply(d *direction, cr *extprocv3.CommonResponse) (last bool) {
	if cr.GetHeaderMutation() != nil {
		x.violate(HeaderMutationIgnored, "header_mutation in a FULL_DUPLEX_STREAMED body reply")
	}
	sr := cr.GetBodyMutation().GetStreamedResponse()
	if len(sr.GetBody()) > 0 {
		d.out = append(d.out, append([]byte(nil), sr.GetBody()...))
	}
	if !sr.GetEndOfStream() {
		return false
	}
	d.outEOS = true
	x.finishCall()
	x.addBodyTiming(d, since(d.bodyStart))
	return true
}

func (x *Exchange) addBodyTiming(d *direction, t time.Duration) {
	tm := &x.rec.Timings
	if !d.response {
		tm.RequestBody += t
		return
	}
	tm.ResponseBody += t
	tm.ResponseBodyMessages++
	if t > tm.ResponseBodyMax {
		tm.ResponseBodyMax = t
	}
}

// onImmediateResponse ends the stream and turns the reply into the local
// reply (Envoy's sendImmediateResponse): status 200 when unset or below 200,
// content-type text/plain with a body, then the reply's header mutation
// under the filter's rules (a failing mutation is only logged by Envoy).
func (x *Exchange) onImmediateResponse(ir *extprocv3.ImmediateResponse) {
	code := int(ir.GetStatus().GetCode())
	if ir.GetStatus() == nil || code < 200 {
		x.violate(ImmediateStatusDefaulted, fmt.Sprintf("status %d: Envoy sends 200", code))
		code = 200
	}
	var h Headers
	if len(ir.GetBody()) > 0 {
		h.Set("content-type", "text/plain")
	}
	if err := applyHeaderMutation(ir.GetHeaders(), &h, mutationRules{}, x.violate); err != nil {
		var fatal errFatal
		if errors.As(err, &fatal) {
			x.violate(fatal.kind, "ImmediateResponse headers: "+fatal.msg)
		}
	}
	x.localReply(&LocalReply{
		Status:        code,
		Headers:       h,
		Body:          append([]byte(nil), ir.GetBody()...),
		Details:       responseCodeDetails(ir.GetDetails()),
		FromProcessor: true,
	})
}

// replyKind names a reply's oneof case for violation details.
func replyKind(r *extprocv3.ProcessingResponse) string {
	switch r.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		return "request_headers"
	case *extprocv3.ProcessingResponse_RequestBody:
		return "request_body"
	case *extprocv3.ProcessingResponse_RequestTrailers:
		return "request_trailers"
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		return "response_headers"
	case *extprocv3.ProcessingResponse_ResponseBody:
		return "response_body"
	case *extprocv3.ProcessingResponse_ResponseTrailers:
		return "response_trailers"
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		return "immediate_response"
	case *extprocv3.ProcessingResponse_StreamedImmediateResponse:
		return "streamed_immediate_response"
	default:
		return "empty"
	}
}
