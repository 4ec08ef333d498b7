package extproc

import (
	"encoding/json"
	"strconv"
	"sync"
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/narwhal-llm/narwhal/wire"
)

// Replies Envoy expects, one builder per message kind. Header values always go in raw_value:
// Envoy ignores value.

// Replies that carry nothing of the request are the same for every stream: built once and
// shared (protobuf messages may be marshalled concurrently while nobody changes them).
var (
	requestHeadersContinue   = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
	requestBodyContinue      = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}
	responseHeadersContinue  = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
	responseHeadersSkipBody  = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}, ModeOverride: skipResponseBody}
	responseBodyContinue     = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
	requestTrailersContinue  = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
	responseTrailersContinue = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
)

func continueRequestHeaders(m *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
	if m == nil {
		return requestHeadersContinue
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: m}},
	}}
}

// continueResponseHeaders lets the response headers through; skipBody asks Envoy (mode_override)
// not to send the body.
func continueResponseHeaders(skipBody bool) *extprocv3.ProcessingResponse {
	if skipBody {
		return responseHeadersSkipBody
	}
	return responseHeadersContinue
}

// continueResponseBody acknowledges a response body chunk; in full duplex it sends the chunk on.
func continueResponseBody(echo []byte, end, fullDuplex bool) *extprocv3.ProcessingResponse {
	if !fullDuplex {
		return responseBodyContinue
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
		ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: streamedBody(echo, end)}},
	}}
}

func continueTrailers(request bool) *extprocv3.ProcessingResponse {
	if request {
		return requestTrailersContinue
	}
	return responseTrailersContinue
}

// echoRequestBody sends a full-duplex request body chunk on upstream unchanged.
func echoRequestBody(b []byte, end bool) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
		RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: streamedBody(b, end)}},
	}}
}

func streamedBody(b []byte, end bool) *extprocv3.BodyMutation {
	return &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
		StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b, EndOfStream: end},
	}}
}

// skipResponseBody is the mode override for responses Narwhal need not read (not a stream, or
// not a success): no body round trips. Body modes are taken literally, so both are set.
var skipResponseBody = &filterv3.ProcessingMode{
	ResponseHeaderMode: filterv3.ProcessingMode_SEND,
	RequestBodyMode:    filterv3.ProcessingMode_NONE,
	ResponseBodyMode:   filterv3.ProcessingMode_NONE,
}

func setHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: key, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// shared holds immutable reply parts that repeat across requests: header options whose value
// is an engine address or a placement kind, and the envoy.lb metadata of each destination.
// Protobuf messages may be marshalled concurrently as long as nobody changes them, so one copy
// serves every stream. Engines are few; the cache stops growing at maxShared entries.
type shared struct {
	headers  sync.Map // [2]string{key, value} -> *corev3.HeaderValueOption
	metadata sync.Map // destination -> *structpb.Struct
	n        atomic.Int64
}

const maxShared = 1 << 14

func (c *shared) header(key, value string) *corev3.HeaderValueOption {
	k := [2]string{key, value}
	if h, ok := c.headers.Load(k); ok {
		return h.(*corev3.HeaderValueOption)
	}
	h := setHeader(key, value)
	if c.n.Add(1) <= maxShared {
		c.headers.Store(k, h)
	}
	return h
}

func (c *shared) lbMetadata(dest string) *structpb.Struct {
	if m, ok := c.metadata.Load(dest); ok {
		return m.(*structpb.Struct)
	}
	m := lbMetadata(dest)
	if c.n.Add(1) <= maxShared {
		c.metadata.Store(dest, m)
	}
	return m
}

// placementReply answers the request body (BUFFERED) or, in full duplex, the request headers,
// with the placement's header mutation, a route cache clear, and envoy.lb metadata.
func placementReply(m *extprocv3.HeaderMutation, md *structpb.Struct, headers bool) *extprocv3.ProcessingResponse {
	common := &extprocv3.CommonResponse{HeaderMutation: m, ClearRouteCache: true}
	resp := &extprocv3.ProcessingResponse{DynamicMetadata: md}
	if headers {
		resp.Response = &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}}
	} else {
		resp.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}}
	}
	return resp
}

func lbMetadata(dest string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		wire.LBNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			wire.HeaderDestination: structpb.NewStringValue(dest),
		}}),
	}}
}

// rejection is an OpenAI-style error Narwhal answers itself.
type rejection struct {
	status     int
	code       string
	message    string
	retryAfter int
}

func immediate(r rejection, details string) *extprocv3.ProcessingResponse {
	headers := []*corev3.HeaderValueOption{setHeader("content-type", "application/json")}
	if r.retryAfter > 0 {
		headers = append(headers, setHeader("retry-after", strconv.Itoa(r.retryAfter)))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(r.status)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: headers},
			Body:    errorBody(r),
			Details: details,
		},
	}}
}

// errorBody writes {"error": {"message", "type", "code"}}.
func errorBody(r rejection) []byte {
	b := make([]byte, 0, 96+len(r.message))
	b = append(b, `{"error":{"message":`...)
	b = appendJSONString(b, r.message)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, errorType(r.status))
	b = append(b, `,"code":`...)
	b = appendJSONString(b, r.code)
	return append(b, "}}"...)
}

func appendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s)
	return append(b, q...)
}

func errorType(status int) string {
	switch {
	case status == 429:
		return "rate_limit_error"
	case status >= 500:
		return "server_error"
	}
	return "invalid_request_error"
}
