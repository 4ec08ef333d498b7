package gateway

import (
	"errors"
	"fmt"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
)

// Body send modes, re-exported so that tests need not import the filter
// package.
const (
	None       = extprocfilterv3.ProcessingMode_NONE
	Streamed   = extprocfilterv3.ProcessingMode_STREAMED
	Buffered   = extprocfilterv3.ProcessingMode_BUFFERED
	FullDuplex = extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
)

// DefaultMessageTimeout is Envoy's default message_timeout.
const DefaultMessageTimeout = 200 * time.Millisecond

// DefaultBufferLimit is Envoy's default per_connection_buffer_limit_bytes.
const DefaultBufferLimit = 1 << 20

// Mode mirrors the ext_proc filter configuration the client plays.
//
// Header modes are fixed: request and response headers are always sent
// (request_header_mode and response_header_mode SEND). Trailers are skipped,
// except that a direction in FULL_DUPLEX_STREAMED has trailer mode SEND as
// Envoy requires; the client never has trailers to send, so the last body
// chunk carries end_of_stream.
type Mode struct {
	// RequestBody and ResponseBody are request_body_mode and
	// response_body_mode: NONE, STREAMED, BUFFERED or FULL_DUPLEX_STREAMED.
	RequestBody, ResponseBody extprocfilterv3.ProcessingMode_BodySendMode
	// AllowModeOverride is allow_mode_override.
	AllowModeOverride bool
	// MessageTimeout is message_timeout; zero means Envoy's default, 200 ms.
	MessageTimeout time.Duration
	// FailureModeAllow is failure_mode_allow.
	FailureModeAllow bool
	// ReceivingNamespaces is metadata_options.receiving_namespaces.untyped.
	ReceivingNamespaces []string
	// ForwardingNamespaces is metadata_options.forwarding_namespaces.untyped: the request's
	// filter metadata of these namespaces goes to the ext_proc server with every message.
	ForwardingNamespaces []string
	// BufferLimit is the connection buffer limit
	// (per_connection_buffer_limit_bytes) that caps a BUFFERED body: Envoy
	// answers 413 itself beyond it. Zero means Envoy's default, 1 MiB;
	// negative means no limit.
	BufferLimit int
}

// Validate reports a configuration Envoy would reject, or one this client
// does not play (BUFFERED_PARTIAL, GRPC).
func (m Mode) Validate() error {
	var errs []error
	for _, d := range []struct {
		name string
		mode extprocfilterv3.ProcessingMode_BodySendMode
	}{{"request_body_mode", m.RequestBody}, {"response_body_mode", m.ResponseBody}} {
		switch d.mode {
		case None, Streamed, Buffered, FullDuplex:
		default:
			errs = append(errs, fmt.Errorf("gateway: %s %v is not supported", d.name, d.mode))
		}
	}
	if m.FailureModeAllow && (m.RequestBody == FullDuplex || m.ResponseBody == FullDuplex) {
		errs = append(errs, errors.New("gateway: FULL_DUPLEX_STREAMED cannot be combined with failure_mode_allow: true"))
	}
	if m.MessageTimeout < 0 {
		errs = append(errs, errors.New("gateway: negative message_timeout"))
	}
	return errors.Join(errs...)
}

// ProcessingMode returns the filter's processing_mode this Mode stands for.
func (m Mode) ProcessingMode() *extprocfilterv3.ProcessingMode {
	pm := &extprocfilterv3.ProcessingMode{
		RequestHeaderMode:   extprocfilterv3.ProcessingMode_SEND,
		ResponseHeaderMode:  extprocfilterv3.ProcessingMode_SEND,
		RequestBodyMode:     m.RequestBody,
		ResponseBodyMode:    m.ResponseBody,
		RequestTrailerMode:  extprocfilterv3.ProcessingMode_SKIP,
		ResponseTrailerMode: extprocfilterv3.ProcessingMode_SKIP,
	}
	if m.RequestBody == FullDuplex {
		pm.RequestTrailerMode = extprocfilterv3.ProcessingMode_SEND
	}
	if m.ResponseBody == FullDuplex {
		pm.ResponseTrailerMode = extprocfilterv3.ProcessingMode_SEND
	}
	return pm
}

func (m Mode) messageTimeout() time.Duration {
	if m.MessageTimeout == 0 {
		return DefaultMessageTimeout
	}
	return m.MessageTimeout
}

func (m Mode) bufferLimit() int {
	if m.BufferLimit == 0 {
		return DefaultBufferLimit
	}
	return m.BufferLimit
}

func (m Mode) receives(ns string) bool {
	for _, r := range m.ReceivingNamespaces {
		if r == ns {
			return true
		}
	}
	return false
}

// effectiveOverride is Envoy's effectiveModeOverride: header and trailer
// modes left at DEFAULT keep the configured value; body modes are taken
// literally (unset means NONE).
func effectiveOverride(target, base *extprocfilterv3.ProcessingMode) *extprocfilterv3.ProcessingMode {
	out := &extprocfilterv3.ProcessingMode{
		RequestHeaderMode:   base.GetRequestHeaderMode(),
		ResponseHeaderMode:  base.GetResponseHeaderMode(),
		RequestTrailerMode:  base.GetRequestTrailerMode(),
		ResponseTrailerMode: base.GetResponseTrailerMode(),
		RequestBodyMode:     target.GetRequestBodyMode(),
		ResponseBodyMode:    target.GetResponseBodyMode(),
	}
	if v := target.GetRequestHeaderMode(); v != extprocfilterv3.ProcessingMode_DEFAULT {
		out.RequestHeaderMode = v
	}
	if v := target.GetResponseHeaderMode(); v != extprocfilterv3.ProcessingMode_DEFAULT {
		out.ResponseHeaderMode = v
	}
	if v := target.GetRequestTrailerMode(); v != extprocfilterv3.ProcessingMode_DEFAULT {
		out.RequestTrailerMode = v
	}
	if v := target.GetResponseTrailerMode(); v != extprocfilterv3.ProcessingMode_DEFAULT {
		out.ResponseTrailerMode = v
	}
	return out
}

// ModeOf is the mode of an ext_proc filter as Envoy configures it: its body modes,
// allow_mode_override, message_timeout, failure_mode_allow, untyped receiving namespaces, and
// bufferLimit (the listener's per_connection_buffer_limit_bytes; 0 for Envoy's default). Header
// modes must be SEND and trailer modes as Mode plays them.
func ModeOf(f *extprocfilterv3.ExternalProcessor, bufferLimit int) (Mode, error) {
	pm := f.GetProcessingMode()
	m := Mode{
		RequestBody:         pm.GetRequestBodyMode(),
		ResponseBody:        pm.GetResponseBodyMode(),
		AllowModeOverride:   f.GetAllowModeOverride(),
		MessageTimeout:      f.GetMessageTimeout().AsDuration(),
		FailureModeAllow:    f.GetFailureModeAllow(),
		ReceivingNamespaces: f.GetMetadataOptions().GetReceivingNamespaces().GetUntyped(),
		BufferLimit:         bufferLimit,
	}
	want := m.ProcessingMode()
	or := func(v, def extprocfilterv3.ProcessingMode_HeaderSendMode) extprocfilterv3.ProcessingMode_HeaderSendMode {
		if v == extprocfilterv3.ProcessingMode_DEFAULT {
			return def
		}
		return v
	}
	send, skip := extprocfilterv3.ProcessingMode_SEND, extprocfilterv3.ProcessingMode_SKIP
	if or(pm.GetRequestHeaderMode(), send) != want.RequestHeaderMode || or(pm.GetResponseHeaderMode(), send) != want.ResponseHeaderMode ||
		or(pm.GetRequestTrailerMode(), skip) != want.RequestTrailerMode || or(pm.GetResponseTrailerMode(), skip) != want.ResponseTrailerMode {
		return Mode{}, fmt.Errorf("gateway: processing_mode %v: headers must be SEND, trailers SKIP (SEND with FULL_DUPLEX_STREAMED)", pm)
	}
	return m, m.Validate()
}
