package envoytest

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/narwhal-llm/narwhal/gateway"
)

// NullServer is an ext_proc server that does nothing: it answers every
// message with the empty reply of the right type (CONTINUE, no mutation),
// and in FULL_DUPLEX_STREAMED echoes each body chunk back as
// streamed_response. It is the floor cost of the protocol, for benchmarks.
type NullServer struct {
	extprocv3.UnimplementedExternalProcessorServer

	streams  atomic.Int64
	messages atomic.Int64
}

var _ extprocv3.ExternalProcessorServer = (*NullServer)(nil)

// Streams returns how many streams the server has accepted.
func (s *NullServer) Streams() int64 { return s.streams.Load() }

// Messages returns how many messages the server has received.
func (s *NullServer) Messages() int64 { return s.messages.Load() }

// Process implements the ext_proc service.
func (s *NullServer) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	s.streams.Add(1)
	var reqDuplex, respDuplex bool
	for {
		req, err := stream.Recv()
		if err != nil {
			return endOfStream(err)
		}
		s.messages.Add(1)
		if pc := req.GetProtocolConfig(); pc != nil {
			reqDuplex = pc.GetRequestBodyMode() == gateway.FullDuplex
			respDuplex = pc.GetResponseBodyMode() == gateway.FullDuplex
		}
		if err := stream.Send(nullReply(req, reqDuplex, respDuplex)); err != nil {
			return endOfStream(err)
		}
	}
}

// nullReply is the empty reply to req.
func nullReply(req *extprocv3.ProcessingRequest, reqDuplex, respDuplex bool) *extprocv3.ProcessingResponse {
	switch v := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
	case *extprocv3.ProcessingRequest_RequestBody:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: bodyReply(v.RequestBody, reqDuplex)}}
	case *extprocv3.ProcessingRequest_ResponseBody:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: bodyReply(v.ResponseBody, respDuplex)}}
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
	default:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
	}
}

func bodyReply(b *extprocv3.HttpBody, duplex bool) *extprocv3.BodyResponse {
	if !duplex {
		return &extprocv3.BodyResponse{}
	}
	return &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
		BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b.GetBody(), EndOfStream: b.GetEndOfStream()},
		}},
	}}
}

// endOfStream maps how a stream ended to what an ext_proc server returns:
// nil for the client's half-close or cancellation (both are how Envoy
// ends a stream), the error otherwise.
func endOfStream(err error) error {
	if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
		return nil
	}
	return err
}

// StartServer serves srv over gRPC on a loopback port until the test ends
// and returns its address.
func StartServer(tb testing.TB, srv extprocv3.ExternalProcessorServer, opts ...grpc.ServerOption) string {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("envoytest: listen: %v", err)
	}
	s := grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(s, srv)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = s.Serve(lis)
	}()
	tb.Cleanup(func() {
		s.Stop()
		<-served
	})
	return lis.Addr().String()
}

// StartServerFunc serves an ext_proc server whose every stream is handled
// by process, for scripting servers (well-behaved or not) in tests.
func StartServerFunc(tb testing.TB, process func(extprocv3.ExternalProcessor_ProcessServer) error, opts ...grpc.ServerOption) string {
	tb.Helper()
	return StartServer(tb, funcServer{process: process}, opts...)
}

type funcServer struct {
	extprocv3.UnimplementedExternalProcessorServer
	process func(extprocv3.ExternalProcessor_ProcessServer) error
}

func (s funcServer) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	return s.process(stream)
}

// StartNullServer serves a NullServer until the test ends and returns its
// address and the server (for its counters).
func StartNullServer(tb testing.TB) (string, *NullServer) {
	tb.Helper()
	s := &NullServer{}
	return StartServer(tb, s), s
}
