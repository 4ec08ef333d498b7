package gateway

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// ErrCancelled is returned (wrapped) when the downstream client went away,
// or a body could not be read, during processing.
var ErrCancelled = errors.New("gateway: request cancelled")

// Request is a downstream request as Envoy's connection manager hands it to
// the ext_proc filter.
type Request struct {
	// Headers include the pseudo-headers; see NewRequestHeaders.
	Headers Headers
	// Body is nil when the request has no body (end_of_stream on the
	// headers). Each Read is one chunk; see the chunking rule on
	// ProcessRequest.
	Body io.Reader
	// FilterMetadata is the request's dynamic metadata as earlier filters set it; Envoy sends
	// the namespaces of metadata_options.forwarding_namespaces.untyped
	// (Mode.ForwardingNamespaces) in every message's metadata_context.
	FilterMetadata map[string]*structpb.Struct
}

// RequestResult is what leaves the filter on the request path.
type RequestResult struct {
	// Headers and Body are the request as it goes upstream.
	Headers Headers
	Body    []byte
	// LocalReply is set when Envoy answers the client itself; nothing goes
	// upstream then.
	LocalReply *LocalReply
	// RouteCacheCleared: the route must be recomputed from Headers;
	// otherwise Envoy keeps the route it chose from the original headers.
	RouteCacheCleared bool
}

// Response is a response entering the filter's encode path: an upstream
// response, or a reply Envoy's router generated (a 503, a 404).
type Response struct {
	// Headers include :status; see NewResponseHeaders.
	Headers Headers
	// Body is nil when the response has no body.
	Body io.Reader
}

// ResponseWriter receives a response as Envoy sends it downstream.
type ResponseWriter interface {
	// WriteHeaders sends the headers (with :status) once.
	WriteHeaders(h Headers) error
	// WriteBody sends one chunk; a streaming writer flushes it.
	WriteBody(p []byte) error
}

// ProcessRequest runs the request phases: request headers (with
// end_of_stream when Body is nil), then the body per request_body_mode:
//
//   - NONE: the body passes unprocessed.
//   - BUFFERED: once the headers reply is in, the whole body goes as one
//     message with end_of_stream; its reply may still mutate the headers.
//     Beyond the buffer limit Envoy answers 413 itself.
//   - STREAMED: one message per chunk, each sent after the previous reply
//     (lock-step; Envoy pipelines chunks as they arrive, so a server must
//     not rely on the lock-step). Replies cannot change the headers, which
//     went upstream with the headers reply.
//   - FULL_DUPLEX_STREAMED: chunks go out as they arrive, without waiting
//     for the headers reply; the body sent upstream is only what comes back
//     as streamed_response; no message_timeout.
//
// Each Read of Body is one chunk; io.EOF returned together with data ends
// the body on that chunk, io.EOF alone sends an empty final chunk.
//
// The whole request phase completes before the result is returned, so a
// caller forwards the request after the last request reply; Envoy releases
// the headers upstream earlier in STREAMED and full duplex. Routing is the
// same: the headers are final when the headers reply (or, for BUFFERED, the
// body reply) has been applied.
//
// The error is non-nil only when the request was cancelled (ErrCancelled)
// or ProcessRequest was misused; protocol failures become a LocalReply and
// Violations in the Record.
func (x *Exchange) ProcessRequest(req Request) (*RequestResult, error) {
	if x.phase != PhaseIdle {
		return nil, fmt.Errorf("gateway: ProcessRequest in phase %v", x.phase)
	}
	d := &x.req
	d.headers, d.noBody, d.held = req.Headers.Clone(), req.Body == nil, true
	x.forwarded = nil
	for _, ns := range x.c.mode.ForwardingNamespaces {
		if m, ok := req.FilterMetadata[ns]; ok {
			if x.forwarded == nil {
				x.forwarded = map[string]*structpb.Struct{}
			}
			x.forwarded[ns] = m
		}
	}
	sink := func(p []byte) error {
		x.rec.RequestBody = append(x.rec.RequestBody, p...)
		return nil
	}
	err := x.runPhases(d, newChunker(req.Body), sink, func() error { return nil })
	if !x.done() {
		x.transition(PhaseRequestDone)
	}
	x.rec.RequestHeaders = d.headers.Clone()
	return &RequestResult{
		Headers:           x.rec.RequestHeaders,
		Body:              x.rec.RequestBody,
		LocalReply:        x.rec.LocalReply,
		RouteCacheCleared: x.rec.RouteCacheCleared,
	}, err
}

// ProcessResponse runs the response phases and writes the response
// downstream through w: response headers, then the body per
// response_body_mode as for the request; trailers are skipped. Headers are
// written once their reply is in (after the body reply in BUFFERED), each
// body chunk as soon as its reply (or streamed_response) is in.
//
// A local reply before anything was written replaces the response; after,
// ProcessResponse returns ErrStreamReset and the caller must abort the
// downstream stream. ProcessResponse must follow a ProcessRequest without a
// local reply.
func (x *Exchange) ProcessResponse(resp Response, w ResponseWriter) error {
	switch x.phase {
	case PhaseRequestDone, PhaseDone, PhaseBypassed:
	default:
		return fmt.Errorf("gateway: ProcessResponse in phase %v", x.phase)
	}
	// Replies that arrived while the request was upstream.
	x.pump()
	out := &downstream{w: w}
	switch x.phase {
	case PhaseLocalReply:
		return x.writeLocalReply(out)
	case PhaseCancelled:
		return x.cancelErr(nil)
	}
	d := &x.resp
	d.headers, d.noBody, d.held = resp.Headers.Clone(), resp.Body == nil, true
	release := func() error {
		if out.started {
			return nil
		}
		x.rec.ResponseHeaders = d.headers.Clone()
		return out.writeHeaders(d.headers)
	}
	sink := func(p []byte) error {
		if err := release(); err != nil {
			return err
		}
		return out.w.WriteBody(p)
	}
	if !x.done() && d.noExternalProcess() {
		x.finish()
	}
	err := x.runPhases(d, newChunker(resp.Body), sink, release)
	if x.phase == PhaseLocalReply {
		return x.writeLocalReply(out)
	}
	if err != nil {
		return err
	}
	if err := release(); err != nil {
		return err
	}
	if !x.done() {
		x.transition(PhaseResponseDone)
	}
	return nil
}

// runPhases drives one direction: headers, then the body per mode. sink
// receives the body as it leaves the filter; release is called when the
// headers leave it.
func (x *Exchange) runPhases(d *direction, src *chunker, sink func([]byte) error, release func() error) error {
	defer src.release()
	if !x.done() && d.sendHeaders {
		x.sendHeaders(d)
		if !x.done() && d.bodyMode == FullDuplex && !d.noBody {
			return x.duplexBody(d, src, sink, release)
		}
		x.await()
	}
	if x.stopped() {
		return x.cancelErr(nil)
	}
	switch {
	case d.replaced:
		if err := release(); err != nil {
			return err
		}
		if len(d.replacement) > 0 {
			if err := sink(d.replacement); err != nil {
				return err
			}
		}
		if src != nil {
			return src.drain(func([]byte) error { return nil })
		}
		return nil
	case d.noBody:
		return nil
	case x.done() || d.bodyMode == None:
		if err := release(); err != nil {
			return err
		}
		return src.drain(sink)
	case d.bodyMode == Buffered:
		return x.bufferedBody(d, src, sink, release)
	case d.bodyMode == Streamed:
		if err := release(); err != nil {
			return err
		}
		return x.streamedBody(d, src, sink)
	default:
		return x.duplexBody(d, src, sink, release)
	}
}

// sendHeaders sends one direction's headers message. Envoy then drops
// content-length from headers whose body will be streamed.
func (x *Exchange) sendHeaders(d *direction) {
	x.startCall(d.headersPhase(), d)
	hh := &extprocv3.HttpHeaders{Headers: d.headers.proto(), EndOfStream: d.noBody}
	req := &extprocv3.ProcessingRequest{}
	if d.response {
		req.Request = &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: hh}
	} else {
		req.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: hh}
	}
	x.send(req)
	if !x.done() && d.streamedBody() {
		d.headers.Del("content-length")
	}
}

// sendBody sends one body message. In full duplex no timer runs and the
// headers reply may still be due.
func (x *Exchange) sendBody(d *direction, data []byte, eos bool) {
	if d.bodyStart.IsZero() {
		d.bodyStart = time.Now()
	}
	d.bodyReceived = true
	if d.bodyMode == FullDuplex {
		if x.phase != d.headersPhase() && x.phase != d.duplexPhase() {
			x.transition(d.duplexPhase())
		}
		if x.phase == d.duplexPhase() {
			x.awaiting = true
		}
	} else {
		x.startCall(d.bodyPhase(), d)
	}
	hb := &extprocv3.HttpBody{Body: data, EndOfStream: eos}
	req := &extprocv3.ProcessingRequest{}
	if d.response {
		req.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: hb}
	} else {
		req.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: hb}
	}
	x.send(req)
}

// bufferedBody reads the whole body, sends it once with end_of_stream and
// hands on the body as the reply left it.
func (x *Exchange) bufferedBody(d *direction, src *chunker, sink func([]byte) error, release func() error) error {
	var body []byte
	for {
		c := src.next()
		if c.err != nil {
			return x.reset(c.err)
		}
		body = append(body, c.data...)
		if limit := x.c.mode.bufferLimit(); limit > 0 && len(body) > limit {
			if d.response {
				x.envoyError(500, "response_payload_too_large", "Internal Server Error")
			} else {
				x.envoyError(413, "request_payload_too_large", "Payload Too Large")
			}
			return nil
		}
		if c.eos {
			break
		}
	}
	x.pump()
	if x.stopped() {
		return x.cancelErr(nil)
	}
	if !x.done() {
		d.body = body
		x.sendBody(d, body, true)
		x.await()
		if x.stopped() {
			return x.cancelErr(nil)
		}
		body = d.body
	}
	if err := release(); err != nil {
		return err
	}
	if len(body) == 0 {
		return nil
	}
	return sink(body)
}

// streamedBody sends each chunk and waits for its reply before handing the
// chunk (as mutated) on.
func (x *Exchange) streamedBody(d *direction, src *chunker, sink func([]byte) error) error {
	for {
		c := src.next()
		if c.err != nil {
			return x.reset(c.err)
		}
		x.pump()
		if x.stopped() {
			return x.cancelErr(nil)
		}
		data := c.data
		if !x.done() {
			d.body, d.bodyEOS = c.data, c.eos
			x.sendBody(d, c.data, c.eos)
			x.await()
			if x.stopped() {
				return x.cancelErr(nil)
			}
			data = d.body
		}
		if len(data) > 0 {
			if err := sink(data); err != nil {
				return err
			}
		}
		if c.eos {
			return nil
		}
	}
}

// duplexBody sends chunks as they arrive and hands on what comes back as
// streamed_response, until its end_of_stream.
func (x *Exchange) duplexBody(d *direction, src *chunker, sink func([]byte) error, release func() error) error {
	chunks, stop := src.start()
	defer stop()
	inputDone, released := false, false
	for {
		if !released && !(x.awaiting && x.phase == d.headersPhase()) && !x.stopped() {
			if err := release(); err != nil {
				return err
			}
			released = true
		}
		for len(d.out) > 0 {
			p := d.out[0]
			d.out = d.out[1:]
			if err := sink(p); err != nil {
				return err
			}
		}
		if x.done() || d.outEOS {
			break
		}
		var in <-chan bodyChunk
		if !inputDone {
			in = chunks
		}
		ev := x.wait(in)
		if ev.kind != evChunk {
			x.dispatch(ev)
			continue
		}
		if ev.chunk.err != nil {
			return x.reset(ev.chunk.err)
		}
		x.sendBody(d, ev.chunk.data, ev.chunk.eos)
		inputDone = ev.chunk.eos
	}
	if x.stopped() {
		return x.cancelErr(nil)
	}
	if !released {
		if err := release(); err != nil {
			return err
		}
	}
	if inputDone {
		return nil
	}
	if d.outEOS {
		// The server ended its streamed_response before the body ended:
		// the rest of the body has nowhere to go.
		x.violate(EarlyEndOfStream, "streamed_response end_of_stream before the body's end_of_stream")
		return nil
	}
	// The processor was dropped: Envoy lets the rest of the body through
	// (what it had already sent is lost).
	for c := range chunks {
		if c.err != nil {
			return x.reset(c.err)
		}
		if len(c.data) > 0 {
			if err := sink(c.data); err != nil {
				return err
			}
		}
		if c.eos {
			return nil
		}
	}
	return nil
}

// reset ends the exchange because a body could not be read: the stream is
// reset on either side, as Envoy destroys the filter.
func (x *Exchange) reset(err error) error {
	x.onCancel()
	return x.cancelErr(err)
}

func (x *Exchange) cancelErr(cause error) error {
	if x.phase != PhaseCancelled {
		return nil
	}
	switch {
	case cause != nil:
		return fmt.Errorf("%w: %w", ErrCancelled, cause)
	case x.ctx.Err() != nil:
		return fmt.Errorf("%w: %w", ErrCancelled, x.ctx.Err())
	default:
		return ErrCancelled
	}
}

// downstream tracks whether the response has started.
type downstream struct {
	w       ResponseWriter
	started bool
}

func (o *downstream) writeHeaders(h Headers) error {
	if o.started {
		return nil
	}
	o.started = true
	return o.w.WriteHeaders(h.Clone())
}

// writeLocalReply sends the local reply downstream, or reports a reset when
// the response has already started.
func (x *Exchange) writeLocalReply(out *downstream) error {
	lr := x.rec.LocalReply
	if out.started {
		lr.Reset = true
		return ErrStreamReset
	}
	h := append(Headers{{Key: ":status", Value: strconv.Itoa(lr.Status)}}, lr.Headers...)
	if err := out.writeHeaders(h); err != nil {
		return err
	}
	if len(lr.Body) == 0 {
		return nil
	}
	return out.w.WriteBody(lr.Body)
}
