package gateway_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/goleak"

	"github.com/narwhal-llm/narwhal/extproc/envoytest"
	"github.com/narwhal-llm/narwhal/gateway"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// relaxed gives mode a message_timeout far beyond Envoy's 200 ms default,
// so that tests not about timeouts do not flake on a loaded machine.
func relaxed(mode gateway.Mode) gateway.Mode {
	if mode.MessageTimeout == 0 {
		mode.MessageTimeout = 10 * time.Second
	}
	return mode
}

// newClient is NewTestClient with a relaxed message_timeout.
func newClient(t *testing.T, addr string, mode gateway.Mode) *gateway.Client {
	t.Helper()
	return envoytest.NewTestClient(t, addr, relaxed(mode))
}

// testCtx is a context that ends with the test (or after d).
func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// reqHeaders builds the request headers of a completion request with a body.
func reqHeaders(body []byte) gateway.Headers {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	return gateway.NewRequestHeaders(http.MethodPost, "/v1/completions", "gateway.test", h)
}

// chunks is a body reader that delivers one chunk per Read, the last one
// together with io.EOF.
type chunks struct{ parts [][]byte }

func (c *chunks) Read(p []byte) (int, error) {
	if len(c.parts) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.parts[0])
	c.parts = c.parts[1:]
	if len(c.parts) == 0 {
		return n, io.EOF
	}
	return n, nil
}

func bodyOf(parts ...string) *chunks {
	c := &chunks{}
	for _, p := range parts {
		c.parts = append(c.parts, []byte(p))
	}
	return c
}

// set is a set_headers entry done right: raw_value, overwrite.
func set(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

func mutation(sets ...*corev3.HeaderValueOption) *extprocv3.HeaderMutation {
	return &extprocv3.HeaderMutation{SetHeaders: sets}
}

func reqHeadersReply(cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: cr}}}
}

func reqBodyReply(cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: cr}}}
}

func respHeadersReply(cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{Response: cr}}}
}

func respBodyReply(cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: cr}}}
}

func streamed(body string, eos bool) *extprocv3.CommonResponse {
	return &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
		StreamedResponse: &extprocv3.StreamedBodyResponse{Body: []byte(body), EndOfStream: eos},
	}}}
}

// continueReply is the empty reply to req (what a server that changes
// nothing sends).
func continueReply(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	switch req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return reqHeadersReply(nil)
	case *extprocv3.ProcessingRequest_RequestBody:
		return reqBodyReply(nil)
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return respHeadersReply(nil)
	default:
		return respBodyReply(nil)
	}
}

// holdUntilClosed waits for the client to end the stream and reports how it
// ended: the stream context's error once the client reset it.
func holdUntilClosed(stream extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		if _, err := stream.Recv(); err != nil {
			break
		}
	}
	select {
	case <-stream.Context().Done():
		return stream.Context().Err()
	case <-time.After(5 * time.Second):
		return nil
	}
}

// memWriter collects a response in memory.
type memWriter struct {
	headers gateway.Headers
	chunks  []string
}

func (w *memWriter) WriteHeaders(h gateway.Headers) error { w.headers = h; return nil }
func (w *memWriter) WriteBody(p []byte) error {
	w.chunks = append(w.chunks, string(p))
	return nil
}

func (w *memWriter) body() string {
	var b bytes.Buffer
	for _, c := range w.chunks {
		b.WriteString(c)
	}
	return b.String()
}

// noViolations fails the test when the record lists any violation.
func noViolations(t *testing.T, rec *gateway.Record) {
	t.Helper()
	if err := rec.Err(); err != nil {
		t.Fatal(err)
	}
}
