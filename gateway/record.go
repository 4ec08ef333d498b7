package gateway

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
)

// Phase is the state of one exchange: which message, if any, the client
// waits for a reply to. It changes only through Exchange.transition.
type Phase int

// The phases, in the order a complete exchange passes them. The last four
// are terminal.
const (
	// PhaseIdle: nothing sent yet; the stream is not open.
	PhaseIdle Phase = iota
	// PhaseRequestHeaders: request headers sent, their reply awaited (in
	// FULL_DUPLEX_STREAMED body chunks may follow before the reply).
	PhaseRequestHeaders
	// PhaseRequestBody: the BUFFERED body, or one STREAMED chunk, was sent;
	// its reply is awaited.
	PhaseRequestBody
	// PhaseRequestBodyDuplex: FULL_DUPLEX_STREAMED request body; streamed
	// chunks are awaited until end_of_stream.
	PhaseRequestBodyDuplex
	// PhaseRequestDone: the request phases are over; the request may go
	// upstream. No reply is expected.
	PhaseRequestDone
	// PhaseResponseHeaders: response headers sent, their reply awaited.
	PhaseResponseHeaders
	// PhaseResponseBody: the BUFFERED response body, or one STREAMED chunk,
	// was sent; its reply is awaited.
	PhaseResponseBody
	// PhaseResponseBodyDuplex: FULL_DUPLEX_STREAMED response body.
	PhaseResponseBodyDuplex
	// PhaseResponseDone: the response phases are over but the stream stays
	// open until the request ends (Envoy keeps it after a BUFFERED body).
	PhaseResponseDone
	// PhaseDone: every expected reply arrived and the stream is closed; the
	// rest of the request flows without the processor.
	PhaseDone
	// PhaseLocalReply: a local reply ended the request (ImmediateResponse or
	// one of Envoy's own error replies).
	PhaseLocalReply
	// PhaseBypassed: the processor was dropped for the rest of the request
	// (failure_mode_allow, or the server ended the stream); traffic continues
	// unprocessed.
	PhaseBypassed
	// PhaseCancelled: the downstream client went away; the stream was reset.
	PhaseCancelled
)

var phaseNames = [...]string{
	PhaseIdle:               "idle",
	PhaseRequestHeaders:     "request_headers",
	PhaseRequestBody:        "request_body",
	PhaseRequestBodyDuplex:  "request_body_duplex",
	PhaseRequestDone:        "request_done",
	PhaseResponseHeaders:    "response_headers",
	PhaseResponseBody:       "response_body",
	PhaseResponseBodyDuplex: "response_body_duplex",
	PhaseResponseDone:       "response_done",
	PhaseDone:               "done",
	PhaseLocalReply:         "local_reply",
	PhaseBypassed:           "bypassed",
	PhaseCancelled:          "cancelled",
}

// String returns the phase's name.
func (p Phase) String() string {
	if p >= 0 && int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", int(p))
}

// Terminal reports whether no further message is exchanged in p.
func (p Phase) Terminal() bool { return p >= PhaseDone }

// ViolationKind names one way a server can break the ext_proc protocol as
// Envoy enforces it.
type ViolationKind string

// The violations the client detects. Each is something a correct server
// never causes.
const (
	// Spurious: a reply of the wrong type, out of order, or with an empty
	// oneof. Envoy answers 500 (or drops the processor when fail-open).
	Spurious ViolationKind = "spurious"
	// ValueNotRawValue: a set_headers entry with `value` and no
	// `raw_value`. Envoy ignores `value` and sets the header to the empty
	// raw_value.
	ValueNotRawValue ViolationKind = "value_not_raw_value"
	// ValueAndRawValue: both `value` and `raw_value` set. Envoy answers 500.
	ValueAndRawValue ViolationKind = "value_and_raw_value"
	// InvalidHeader: a mutation with an invalid header name or value. Envoy
	// answers 500.
	InvalidHeader ViolationKind = "invalid_header"
	// RefusedMutation: a mutation Envoy's default mutation rules skip
	// silently: removing a ':' header or host; setting host, :authority,
	// :method or :scheme; touching x-envoy-*.
	RefusedMutation ViolationKind = "refused_mutation"
	// HeaderMutationIgnored: a header mutation Envoy does not apply (in a
	// STREAMED or FULL_DUPLEX_STREAMED body reply, when the headers have
	// already gone on).
	HeaderMutationIgnored ViolationKind = "header_mutation_ignored"
	// ContentLengthMismatch: a BUFFERED body mutation whose length differs
	// from the content-length header. Envoy answers 500.
	ContentLengthMismatch ViolationKind = "content_length_mismatch"
	// ImmediateStatusDefaulted: an ImmediateResponse without a status (or
	// below 200). Envoy sends 200.
	ImmediateStatusDefaulted ViolationKind = "immediate_status_defaulted"
	// MetadataNotReceived: dynamic_metadata in a namespace the filter does
	// not receive (or typed_dynamic_metadata). Envoy drops it.
	MetadataNotReceived ViolationKind = "metadata_not_received"
	// ModeOverrideIgnored: a mode_override Envoy does not honour (no
	// allow_mode_override, full duplex configured, or not a headers reply).
	ModeOverrideIgnored ViolationKind = "mode_override_ignored"
	// RouteCacheClearIgnored: clear_route_cache without a header mutation in
	// the same reply (or in a response-path reply). Envoy ignores it.
	RouteCacheClearIgnored ViolationKind = "route_cache_clear_ignored"
	// TimeoutOverrideIgnored: override_message_timeout; with Envoy's
	// default max_message_timeout (0) the whole reply is ignored.
	TimeoutOverrideIgnored ViolationKind = "override_message_timeout_ignored"
	// MessageTimeout: no reply within message_timeout. Envoy answers 504 (or
	// drops the processor when fail-open).
	MessageTimeout ViolationKind = "message_timeout"
	// StreamError: the server ended the stream with a non-OK status. Envoy
	// answers 500 (or drops the processor when fail-open).
	StreamError ViolationKind = "stream_error"
	// ServerClosed: the server ended the stream with OK while replies were
	// still expected. Envoy carries on without the processor.
	ServerClosed ViolationKind = "server_closed"
	// EarlyEndOfStream: a FULL_DUPLEX_STREAMED streamed_response ended
	// before the body it answers; the rest of the body is dropped.
	EarlyEndOfStream ViolationKind = "early_end_of_stream"
)

// Violation is one protocol violation, with the phase it happened in.
type Violation struct {
	Kind   ViolationKind
	Phase  Phase
	Detail string
}

// String describes the violation.
func (v Violation) String() string {
	if v.Detail == "" {
		return fmt.Sprintf("%s in %s", v.Kind, v.Phase)
	}
	return fmt.Sprintf("%s in %s: %s", v.Kind, v.Phase, v.Detail)
}

// LocalReply is a response Envoy generates instead of forwarding one.
type LocalReply struct {
	Status int
	// Headers are the reply's headers after the ImmediateResponse's header
	// mutation (content-type text/plain when there is a body, as Envoy's
	// local replies have).
	Headers Headers
	Body    []byte
	// Details are the response code details, whitespace replaced by '_' as
	// Envoy does.
	Details string
	// FromProcessor is true for the server's ImmediateResponse, false for
	// Envoy's own error replies (500 on a spurious reply, stream error or
	// rejected mutation; 504 on message_timeout; 413 over the buffer limit).
	FromProcessor bool
	// Phase is the phase the reply ended.
	Phase Phase
	// Reset is true when the response had already started downstream: Envoy
	// then resets the stream instead of sending the reply.
	Reset bool
}

// Timings are the processor's latencies per phase, measured as Envoy does
// from sending a message to handling its reply.
type Timings struct {
	// RequestHeaders: request headers sent → their reply.
	RequestHeaders time.Duration
	// RequestBody: summed over body messages (one in BUFFERED); in
	// FULL_DUPLEX_STREAMED, first chunk sent → last streamed chunk.
	RequestBody time.Duration
	// ResponseHeaders: response headers sent → their reply.
	ResponseHeaders time.Duration
	// ResponseBody: summed over response body messages.
	ResponseBody time.Duration
	// ResponseBodyMax: the slowest single response body reply.
	ResponseBodyMax time.Duration
	// ResponseBodyMessages counts response body replies.
	ResponseBodyMessages int
	// Stream: stream opened → stream closed.
	Stream time.Duration
}

// Record is what Envoy would have done with one request, for assertions.
type Record struct {
	// Phase is the phase the exchange ended in (or is in).
	Phase Phase
	// RequestHeaders are the request headers as they leave the filter, after
	// every applied mutation.
	RequestHeaders Headers
	// RequestBody is the request body as it leaves the filter.
	RequestBody []byte
	// ResponseHeaders are the response headers (with :status) as they leave
	// the filter; nil when there was no response phase.
	ResponseHeaders Headers
	// DynamicMetadata holds the metadata Envoy accepted, by namespace.
	DynamicMetadata map[string]*structpb.Struct
	// RouteCacheCleared is set when a request-path reply carried
	// clear_route_cache together with a header mutation.
	RouteCacheCleared bool
	// ModeOverrides counts the mode_override values Envoy applied.
	ModeOverrides int
	// LocalReply is set when Envoy answered the client itself.
	LocalReply *LocalReply
	// Bypassed says why the processor was dropped for the rest of the
	// request ("" when it was not).
	Bypassed string
	// Cancelled is set when the downstream client went away, or a body
	// could not be read (a reset on either side).
	Cancelled bool
	// Violations lists every protocol violation seen, in order.
	Violations []Violation
	// Sent and Received count messages on the stream.
	Sent, Received int
	// ProtocolConfigSent is set when the first message carried
	// protocol_config.
	ProtocolConfigSent bool
	// Timings are the processor's latencies.
	Timings Timings
}

// Has reports whether a violation of kind was recorded.
func (r *Record) Has(kind ViolationKind) bool {
	for _, v := range r.Violations {
		if v.Kind == kind {
			return true
		}
	}
	return false
}

// Err returns nil when the server behaved, or an error listing every
// violation.
func (r *Record) Err() error {
	if len(r.Violations) == 0 {
		return nil
	}
	parts := make([]string, len(r.Violations))
	for i, v := range r.Violations {
		parts[i] = v.String()
	}
	return fmt.Errorf("gateway: ext_proc violations: %s", strings.Join(parts, "; "))
}

// Metadata returns the string value of key in namespace ns of the accepted
// dynamic metadata, or "".
func (r *Record) Metadata(ns, key string) string {
	return r.DynamicMetadata[ns].GetFields()[key].GetStringValue()
}
