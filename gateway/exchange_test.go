package gateway_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/narwhal-llm/narwhal/extproc/envoytest"
	"github.com/narwhal-llm/narwhal/gateway"
	"github.com/narwhal-llm/narwhal/wire"
)

// TestWhatEnvoySends checks the messages of a BUFFERED request as the server
// sees them: raw_value only, lower-case keys, pseudo-headers, x-request-id,
// protocol_config on the first message only, one body message with
// end_of_stream, and that a BUFFERED body reply may still mutate headers.
func TestWhatEnvoySends(t *testing.T) {
	body := []byte(`{"model":"m","prompt":"hello"}`)
	got := make(chan []*extprocv3.ProcessingRequest, 1)
	addr := envoytest.StartServerFunc(t, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		var msgs []*extprocv3.ProcessingRequest
		defer func() { got <- msgs }()
		h, err := s.Recv()
		if err != nil {
			return err
		}
		msgs = append(msgs, h)
		if err := s.Send(reqHeadersReply(&extprocv3.CommonResponse{HeaderMutation: mutation(set("x-from-headers", "1"))})); err != nil {
			return err
		}
		b, err := s.Recv()
		if err != nil {
			return err
		}
		msgs = append(msgs, b)
		return s.Send(reqBodyReply(&extprocv3.CommonResponse{
			HeaderMutation:  mutation(set("x-gateway-destination-endpoint", "10.0.0.7:8000")),
			ClearRouteCache: true,
		}))
	})
	c := newClient(t, addr, gateway.Mode{RequestBody: gateway.Buffered, ResponseBody: gateway.Streamed})
	x := c.NewExchange(testCtx(t, 5*time.Second))
	defer x.Close()
	res, err := x.ProcessRequest(gateway.Request{Headers: reqHeaders(body), Body: bodyOf(string(body[:10]), string(body[10:]))})
	if err != nil {
		t.Fatal(err)
	}
	msgs := <-got
	if len(msgs) != 2 {
		t.Fatalf("server saw %d messages, want 2", len(msgs))
	}
	hm := msgs[0].GetRequestHeaders()
	if hm == nil || hm.GetEndOfStream() {
		t.Fatalf("first message = %v, want request headers without end_of_stream", msgs[0])
	}
	seen := map[string]bool{}
	for _, hv := range hm.GetHeaders().GetHeaders() {
		if hv.GetValue() != "" || hv.GetKey() != strings.ToLower(hv.GetKey()) {
			t.Errorf("header %q: value %q set or key not lower-case", hv.GetKey(), hv.GetValue())
		}
		seen[hv.GetKey()] = len(hv.GetRawValue()) > 0
	}
	for _, k := range []string{":method", ":path", ":authority", ":scheme", "x-request-id", "content-type", "content-length"} {
		if !seen[k] {
			t.Errorf("request headers lack %s in raw_value", k)
		}
	}
	pc := msgs[0].GetProtocolConfig()
	if pc == nil || pc.GetRequestBodyMode() != gateway.Buffered || pc.GetResponseBodyMode() != gateway.Streamed {
		t.Errorf("protocol_config = %v, want BUFFERED/STREAMED", pc)
	}
	if msgs[1].GetProtocolConfig() != nil {
		t.Error("protocol_config sent again on the body message")
	}
	if rb := msgs[1].GetRequestBody(); !bytes.Equal(rb.GetBody(), body) || !rb.GetEndOfStream() {
		t.Errorf("body message = %q eos=%v, want the whole body with end_of_stream", rb.GetBody(), rb.GetEndOfStream())
	}
	if res.Headers.Get("x-from-headers") != "1" || res.Headers.Get("x-gateway-destination-endpoint") != "10.0.0.7:8000" {
		t.Errorf("final headers %v lack the mutations", res.Headers)
	}
	if !res.RouteCacheCleared || !bytes.Equal(res.Body, body) || res.LocalReply != nil {
		t.Errorf("result = cleared %v body %q local %v", res.RouteCacheCleared, res.Body, res.LocalReply)
	}
	noViolations(t, x.Record())
}

// replyOnce serves streams that read the first message, send reply, then
// hold the stream until the client closes it, reporting how it ended.
func replyOnce(t *testing.T, reply *extprocv3.ProcessingResponse, ended chan<- error) string {
	return envoytest.StartServerFunc(t, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		if _, err := s.Recv(); err != nil {
			return err
		}
		if err := s.Send(reply); err != nil {
			return err
		}
		err := holdUntilClosed(s)
		if ended != nil {
			ended <- err
		}
		return nil
	})
}

func TestSpuriousReplies(t *testing.T) {
	cases := []struct {
		name    string
		reply   *extprocv3.ProcessingResponse
		details string
	}{
		{"wrong type", respHeadersReply(nil), "spurious_message"},
		{"body reply to headers", reqBodyReply(nil), "spurious_message"},
		{"trailers reply", &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}, "spurious_message"},
		{"empty oneof", &extprocv3.ProcessingResponse{}, "unhandled_message"},
		{"streamed immediate response", &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_StreamedImmediateResponse{}}, "unhandled_message"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ended := make(chan error, 1)
			addr := replyOnce(t, tc.reply, ended)
			c := newClient(t, addr, gateway.Mode{RequestBody: gateway.Buffered})
			x := c.NewExchange(testCtx(t, 5*time.Second))
			defer x.Close()
			res, err := x.ProcessRequest(gateway.Request{Headers: reqHeaders([]byte("{}")), Body: bodyOf("{}")})
			if err != nil {
				t.Fatal(err)
			}
			lr := res.LocalReply
			if lr == nil || lr.Status != 500 || lr.FromProcessor || lr.Details != tc.details {
				t.Fatalf("local reply = %+v, want Envoy's 500 %q", lr, tc.details)
			}
			if !x.Record().Has(gateway.Spurious) || x.Phase() != gateway.PhaseLocalReply {
				t.Errorf("record %+v lacks the spurious violation", x.Record())
			}
			if err := <-ended; !errors.Is(err, context.Canceled) {
				t.Errorf("server saw the stream end with %v, want a reset (context.Canceled)", err)
			}
		})
	}

	t.Run("fail open", func(t *testing.T) {
		addr := replyOnce(t, respHeadersReply(nil), nil)
		c := newClient(t, addr, gateway.Mode{RequestBody: gateway.Buffered, FailureModeAllow: true})
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		h := reqHeaders([]byte("{}"))
		res, err := x.ProcessRequest(gateway.Request{Headers: h, Body: bodyOf("{}")})
		if err != nil {
			t.Fatal(err)
		}
		if res.LocalReply != nil || x.Phase() != gateway.PhaseBypassed || string(res.Body) != "{}" {
			t.Fatalf("fail-open: local %+v phase %v body %q, want the request to continue unprocessed", res.LocalReply, x.Phase(), res.Body)
		}
		if !x.Record().Has(gateway.Spurious) {
			t.Error("spurious reply not recorded")
		}
	})

	t.Run("second reply to headers", func(t *testing.T) {
		addr := envoytest.StartServerFunc(t, func(s extprocv3.ExternalProcessor_ProcessServer) error {
			if _, err := s.Recv(); err != nil {
				return nil
			}
			// One reply too many: it reaches the client before the body
			// reply, whatever the timing.
			_ = s.Send(reqHeadersReply(nil))
			_ = s.Send(reqHeadersReply(nil))
			if _, err := s.Recv(); err != nil {
				return nil
			}
			_ = s.Send(reqBodyReply(nil))
			return holdUntilClosedNil(s)
		})
		c := newClient(t, addr, gateway.Mode{RequestBody: gateway.Buffered})
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		res, err := x.ProcessRequest(gateway.Request{Headers: reqHeaders([]byte("{}")), Body: bodyOf("{}")})
		if err != nil {
			t.Fatal(err)
		}
		if res.LocalReply == nil || res.LocalReply.Status != 500 || !x.Record().Has(gateway.Spurious) {
			t.Fatalf("extra headers reply: local %+v, violations %v", res.LocalReply, x.Record().Violations)
		}
	})
}

func TestHeaderMutationRules(t *testing.T) {
	t.Run("value and raw_value", func(t *testing.T) {
		both := &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "x-a", Value: "v", RawValue: []byte("v")}}
		addr := replyOnce(t, reqHeadersReply(&extprocv3.CommonResponse{HeaderMutation: mutation(both)}), nil)
		c := newClient(t, addr, gateway.Mode{})
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		res, _ := x.ProcessRequest(gateway.Request{Headers: reqHeaders(nil)})
		lr := res.LocalReply
		if lr == nil || lr.Status != 500 || lr.Details != "Only_one_of_value_or_raw_value_in_the_HeaderValue_message_should_be_set." {
			t.Fatalf("local reply = %+v, want 500", lr)
		}
		if !x.Record().Has(gateway.ValueAndRawValue) {
			t.Error("violation not recorded")
		}
	})

	t.Run("value only", func(t *testing.T) {
		valueOnly := &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "x-gateway-destination-endpoint", Value: "10.0.0.1:80"}}
		addr := replyOnce(t, reqHeadersReply(&extprocv3.CommonResponse{HeaderMutation: mutation(valueOnly)}), nil)
		c := newClient(t, addr, gateway.Mode{})
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		h := reqHeaders(nil)
		h.Set("x-gateway-destination-endpoint", "6.6.6.6:80") // client-supplied
		res, _ := x.ProcessRequest(gateway.Request{Headers: h})
		if res.LocalReply != nil {
			t.Fatalf("unexpected local reply %+v", res.LocalReply)
		}
		if got := res.Headers.Values("x-gateway-destination-endpoint"); len(got) != 1 || got[0] != "" {
			t.Errorf("destination = %q, want Envoy's empty raw_value", got)
		}
		if !x.Record().Has(gateway.ValueNotRawValue) {
			t.Error("violation not recorded")
		}
	})

	t.Run("refused", func(t *testing.T) {
		m := &extprocv3.HeaderMutation{
			SetHeaders: []*corev3.HeaderValueOption{
				set(":authority", "evil"), set("host", "evil"), set(":method", "DELETE"), set(":scheme", "https"),
				set("x-envoy-original-path", "/x"), set("x-ok", "1"), set(":path", "/v1/chat/completions"),
			},
			RemoveHeaders: []string{":path", "host", "x-envoy-foo", "x-drop"},
		}
		addr := replyOnce(t, reqHeadersReply(&extprocv3.CommonResponse{HeaderMutation: m}), nil)
		c := newClient(t, addr, gateway.Mode{})
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		h := reqHeaders(nil)
		h.Set("x-drop", "1")
		h.Set("x-envoy-foo", "1")
		res, _ := x.ProcessRequest(gateway.Request{Headers: h})
		if res.LocalReply != nil {
			t.Fatalf("refused mutations must be skipped silently, got %+v", res.LocalReply)
		}
		fh := res.Headers
		if fh.Get(":authority") != "gateway.test" || fh.Get(":method") != "POST" || fh.Get(":scheme") != "http" || fh.Has("host") || fh.Has("x-envoy-original-path") {
			t.Errorf("routing headers changed: %v", fh)
		}
		if fh.Get("x-ok") != "1" || fh.Has("x-drop") || !fh.Has("x-envoy-foo") || fh.Get(":path") != "/v1/chat/completions" {
			t.Errorf("allowed mutations not applied or refused ones applied: %v", fh)
		}
		n := 0
		for _, v := range x.Record().Violations {
			if v.Kind == gateway.RefusedMutation {
				n++
			}
		}
		if n != 8 {
			t.Errorf("%d refused mutations recorded, want 8: %v", n, x.Record().Violations)
		}
	})

	t.Run("invalid name", func(t *testing.T) {
		addr := replyOnce(t, reqHeadersReply(&extprocv3.CommonResponse{HeaderMutation: mutation(set("bad header", "1"))}), nil)
		c := newClient(t, addr, gateway.Mode{})
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		res, _ := x.ProcessRequest(gateway.Request{Headers: reqHeaders(nil)})
		if res.LocalReply == nil || res.LocalReply.Status != 500 || !x.Record().Has(gateway.InvalidHeader) {
			t.Fatalf("invalid header name: local %+v", res.LocalReply)
		}
	})
}

func TestImmediateResponse(t *testing.T) {
	t.Run("without status", func(t *testing.T) {
		ended := make(chan error, 1)
		ir := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{Body: []byte("no")}}}
		addr := replyOnce(t, ir, ended)
		c := newClient(t, addr, gateway.Mode{RequestBody: gateway.Buffered})
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		res, _ := x.ProcessRequest(gateway.Request{Headers: reqHeaders([]byte("{}")), Body: bodyOf("{}")})
		lr := res.LocalReply
		if lr == nil || lr.Status != 200 || !lr.FromProcessor || lr.Headers.Get("content-type") != "text/plain" {
			t.Fatalf("local reply = %+v, want Envoy's defaulted 200", lr)
		}
		if !x.Record().Has(gateway.ImmediateStatusDefaulted) {
			t.Error("defaulted status not flagged")
		}
		if err := <-ended; !errors.Is(err, context.Canceled) {
			t.Errorf("stream not closed after the ImmediateResponse: %v", err)
		}
	})

	t.Run("rejection", func(t *testing.T) {
		ir := &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests},
			Headers: mutation(set("content-type", "application/json"), set("retry-after", "1")),
			Body:    []byte(`{"error":{"code":"waiting_set_full"}}`),
			Details: "waiting set full",
		}
		md, _ := structpb.NewStruct(map[string]any{"envoy.lb": map[string]any{"k": "v"}})
		addr := replyOnce(t, &extprocv3.ProcessingResponse{
			Response:        &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: ir},
			DynamicMetadata: md,
		}, nil)
		c := newClient(t, addr, gateway.Mode{ReceivingNamespaces: []string{"envoy.lb"}})
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		res, _ := x.ProcessRequest(gateway.Request{Headers: reqHeaders(nil)})
		lr := res.LocalReply
		if lr == nil || lr.Status != 429 || lr.Details != "waiting_set_full" || lr.Headers.Get("content-type") != "application/json" || lr.Headers.Get("retry-after") != "1" {
			t.Fatalf("local reply = %+v", lr)
		}
		if x.Record().Metadata("envoy.lb", "k") != "v" {
			t.Error("metadata of an ImmediateResponse not applied")
		}
		noViolations(t, x.Record())
	})

	t.Run("response started", func(t *testing.T) {
		addr := envoytest.StartServerFunc(t, func(s extprocv3.ExternalProcessor_ProcessServer) error {
			for {
				req, err := s.Recv()
				if err != nil {
					return nil
				}
				reply := continueReply(req)
				if req.GetResponseBody() != nil {
					reply = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{Status: &typev3.HttpStatus{Code: 500}}}}
				}
				if err := s.Send(reply); err != nil {
					return nil
				}
			}
		})
		c := newClient(t, addr, gateway.Mode{ResponseBody: gateway.Streamed})
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		if _, err := x.ProcessRequest(gateway.Request{Headers: reqHeaders(nil)}); err != nil {
			t.Fatal(err)
		}
		w := &memWriter{}
		err := x.ProcessResponse(gateway.Response{Headers: gateway.NewResponseHeaders(200, nil), Body: bodyOf("data: 1\n\n")}, w)
		if !errors.Is(err, gateway.ErrStreamReset) || !x.Record().LocalReply.Reset {
			t.Fatalf("ProcessResponse = %v, want a reset once the response started", err)
		}
	})
}

func TestMessageTimeout(t *testing.T) {
	const timeout = 50 * time.Millisecond
	slow := func(ended chan<- error) string {
		return envoytest.StartServerFunc(t, func(s extprocv3.ExternalProcessor_ProcessServer) error {
			err := holdUntilClosed(s) // never replies
			ended <- err
			return nil
		})
	}

	t.Run("fail closed", func(t *testing.T) {
		ended := make(chan error, 1)
		c := newClient(t, slow(ended), gateway.Mode{MessageTimeout: timeout})
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		start := time.Now()
		res, _ := x.ProcessRequest(gateway.Request{Headers: reqHeaders(nil)})
		if el := time.Since(start); el < timeout || el > 2*time.Second {
			t.Errorf("gave up after %v, want about %v", el, timeout)
		}
		lr := res.LocalReply
		if lr == nil || lr.Status != 504 || lr.Details != "ext_proc_error_per-message_timeout_exceeded" {
			t.Fatalf("local reply = %+v, want 504", lr)
		}
		if !x.Record().Has(gateway.MessageTimeout) {
			t.Error("timeout not recorded")
		}
		if err := <-ended; !errors.Is(err, context.Canceled) {
			t.Errorf("server saw %v, want its stream cancelled", err)
		}
	})

	t.Run("fail open", func(t *testing.T) {
		ended := make(chan error, 1)
		c := newClient(t, slow(ended), gateway.Mode{MessageTimeout: timeout, FailureModeAllow: true})
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		res, _ := x.ProcessRequest(gateway.Request{Headers: reqHeaders(nil)})
		if res.LocalReply != nil || x.Phase() != gateway.PhaseBypassed || res.Headers.Get(":path") != "/v1/completions" {
			t.Fatalf("fail-open timeout: local %+v phase %v", res.LocalReply, x.Phase())
		}
		<-ended
	})

	t.Run("slow body reply", func(t *testing.T) {
		addr := envoytest.StartServerFunc(t, func(s extprocv3.ExternalProcessor_ProcessServer) error {
			req, err := s.Recv()
			if err != nil {
				return nil
			}
			if err := s.Send(continueReply(req)); err != nil {
				return nil
			}
			if _, err := s.Recv(); err != nil {
				return nil
			}
			time.Sleep(3 * timeout) // a request held in a waiting set
			_ = s.Send(reqBodyReply(nil))
			return nil
		})
		c := newClient(t, addr, gateway.Mode{RequestBody: gateway.Buffered, MessageTimeout: timeout})
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		res, _ := x.ProcessRequest(gateway.Request{Headers: reqHeaders([]byte("{}")), Body: bodyOf("{}")})
		if res.LocalReply == nil || res.LocalReply.Status != 504 {
			t.Fatalf("a body reply beyond message_timeout must give 504, got %+v", res.LocalReply)
		}
	})

	t.Run("full duplex has no timeout", func(t *testing.T) {
		addr := envoytest.StartServerFunc(t, func(s extprocv3.ExternalProcessor_ProcessServer) error {
			var body []byte
			for {
				req, err := s.Recv()
				if err != nil {
					return nil
				}
				if b := req.GetRequestBody(); b != nil {
					body = append(body, b.GetBody()...)
					if b.GetEndOfStream() {
						break
					}
				}
			}
			time.Sleep(3 * timeout)
			if err := s.Send(reqHeadersReply(nil)); err != nil {
				return nil
			}
			_ = s.Send(reqBodyReply(streamed(string(body), true)))
			return holdUntilClosedNil(s)
		})
		c := newClient(t, addr, gateway.Mode{RequestBody: gateway.FullDuplex, MessageTimeout: timeout})
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		res, err := x.ProcessRequest(gateway.Request{Headers: reqHeaders([]byte("abc")), Body: bodyOf("abc")})
		if err != nil || res.LocalReply != nil || string(res.Body) != "abc" {
			t.Fatalf("full duplex: err %v local %+v body %q", err, res.LocalReply, res.Body)
		}
		noViolations(t, x.Record())
	})

	t.Run("override_message_timeout ignored", func(t *testing.T) {
		addr := envoytest.StartServerFunc(t, func(s extprocv3.ExternalProcessor_ProcessServer) error {
			if _, err := s.Recv(); err != nil {
				return nil
			}
			_ = s.Send(&extprocv3.ProcessingResponse{
				Response:               &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}},
				OverrideMessageTimeout: durationpb.New(time.Second),
			})
			return holdUntilClosedNil(s)
		})
		// Long enough for the override to arrive first on a loaded machine.
		c := newClient(t, addr, gateway.Mode{MessageTimeout: 500 * time.Millisecond})
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		res, _ := x.ProcessRequest(gateway.Request{Headers: reqHeaders(nil)})
		if res.LocalReply == nil || res.LocalReply.Status != 504 || !x.Record().Has(gateway.TimeoutOverrideIgnored) {
			t.Fatalf("a reply with override_message_timeout is ignored whole: local %+v", res.LocalReply)
		}
	})
}

func holdUntilClosedNil(s extprocv3.ExternalProcessor_ProcessServer) error {
	_ = holdUntilClosed(s)
	return nil
}

func TestDynamicMetadataNamespaces(t *testing.T) {
	md, err := structpb.NewStruct(map[string]any{
		"envoy.lb":      map[string]any{"x-gateway-destination-endpoint": "10.0.0.1:8000"},
		"narwhal.debug": map[string]any{"k": "v"},
	})
	if err != nil {
		t.Fatal(err)
	}
	reply := reqHeadersReply(nil)
	reply.DynamicMetadata = md
	for _, tc := range []struct {
		name      string
		receiving []string
		wantLB    string
	}{
		{"envoy.lb received", []string{"envoy.lb"}, "10.0.0.1:8000"},
		{"none received", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := replyOnce(t, reply, nil)
			c := newClient(t, addr, gateway.Mode{ReceivingNamespaces: tc.receiving})
			x := c.NewExchange(testCtx(t, 5*time.Second))
			defer x.Close()
			if _, err := x.ProcessRequest(gateway.Request{Headers: reqHeaders(nil)}); err != nil {
				t.Fatal(err)
			}
			rec := x.Record()
			if got := rec.Metadata("envoy.lb", "x-gateway-destination-endpoint"); got != tc.wantLB {
				t.Errorf("envoy.lb = %q, want %q", got, tc.wantLB)
			}
			if rec.DynamicMetadata["narwhal.debug"] != nil || !rec.Has(gateway.MetadataNotReceived) {
				t.Errorf("metadata outside receiving_namespaces kept or not flagged: %v", rec.Violations)
			}
		})
	}
}

// countingServer answers everything with CONTINUE (plus extra, when set, on
// the response headers reply) and counts body messages per direction.
func countingServer(t *testing.T, onRespHeaders func(*extprocv3.ProcessingResponse), onReqHeaders func(*extprocv3.ProcessingResponse), counts chan<- [2]int) string {
	return envoytest.StartServerFunc(t, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		var n [2]int
		defer func() { counts <- n }()
		for {
			req, err := s.Recv()
			if err != nil {
				return nil
			}
			reply := continueReply(req)
			switch {
			case req.GetRequestHeaders() != nil && onReqHeaders != nil:
				onReqHeaders(reply)
			case req.GetResponseHeaders() != nil && onRespHeaders != nil:
				onRespHeaders(reply)
			case req.GetRequestBody() != nil:
				n[0]++
			case req.GetResponseBody() != nil:
				n[1]++
			}
			if err := s.Send(reply); err != nil {
				return nil
			}
		}
	})
}

func TestModeOverride(t *testing.T) {
	skipBody := func(r *extprocv3.ProcessingResponse) {
		r.ModeOverride = &extprocfilterv3.ProcessingMode{ResponseBodyMode: gateway.None}
	}
	run := func(t *testing.T, mode gateway.Mode, onReq, onResp func(*extprocv3.ProcessingResponse)) (*gateway.Record, [2]int, *memWriter) {
		counts := make(chan [2]int, 1)
		addr := countingServer(t, onResp, onReq, counts)
		c := newClient(t, addr, mode)
		x := c.NewExchange(testCtx(t, 5*time.Second))
		res, err := x.ProcessRequest(gateway.Request{Headers: reqHeaders([]byte("{}")), Body: bodyOf("{}")})
		if err != nil || res.LocalReply != nil {
			t.Fatalf("request: %v %+v", err, res.LocalReply)
		}
		w := &memWriter{}
		if err := x.ProcessResponse(gateway.Response{Headers: gateway.NewResponseHeaders(200, nil), Body: bodyOf("a", "b")}, w); err != nil {
			t.Fatal(err)
		}
		x.Close()
		if w.body() != "ab" {
			t.Errorf("response body = %q", w.body())
		}
		return x.Record(), <-counts, w
	}

	t.Run("not allowed", func(t *testing.T) {
		rec, n, _ := run(t, gateway.Mode{RequestBody: gateway.Buffered, ResponseBody: gateway.Streamed}, nil, skipBody)
		if !rec.Has(gateway.ModeOverrideIgnored) || n[1] != 2 {
			t.Errorf("without allow_mode_override: violations %v, %d response body messages (want 2)", rec.Violations, n[1])
		}
	})
	t.Run("allowed at response headers", func(t *testing.T) {
		rec, n, _ := run(t, gateway.Mode{RequestBody: gateway.Buffered, ResponseBody: gateway.Streamed, AllowModeOverride: true}, nil, skipBody)
		noViolations(t, rec)
		if rec.ModeOverrides != 1 || n[1] != 0 || rec.Phase != gateway.PhaseDone {
			t.Errorf("override: %d applied, %d response body messages, phase %v", rec.ModeOverrides, n[1], rec.Phase)
		}
	})
	t.Run("body modes literal", func(t *testing.T) {
		// Only the response header mode is meant, but the unset request
		// body mode means NONE: the BUFFERED request body is skipped too.
		onReq := func(r *extprocv3.ProcessingResponse) {
			r.ModeOverride = &extprocfilterv3.ProcessingMode{ResponseHeaderMode: extprocfilterv3.ProcessingMode_SKIP}
		}
		rec, n, _ := run(t, gateway.Mode{RequestBody: gateway.Buffered, ResponseBody: gateway.Streamed, AllowModeOverride: true}, onReq, nil)
		if n != [2]int{0, 0} || rec.ResponseHeaders.Status() != 200 {
			t.Errorf("literal override: body messages %v", n)
		}
	})
	t.Run("to full duplex at response headers", func(t *testing.T) {
		addr := envoytest.StartServerFunc(t, func(s extprocv3.ExternalProcessor_ProcessServer) error {
			for {
				req, err := s.Recv()
				if err != nil {
					return nil
				}
				reply := continueReply(req)
				switch {
				case req.GetResponseHeaders() != nil:
					reply.ModeOverride = &extprocfilterv3.ProcessingMode{ResponseBodyMode: gateway.FullDuplex}
				case req.GetResponseBody() != nil:
					b := req.GetResponseBody()
					reply = respBodyReply(streamed(strings.ToUpper(string(b.GetBody())), b.GetEndOfStream()))
				}
				if err := s.Send(reply); err != nil {
					return nil
				}
			}
		})
		c := newClient(t, addr, gateway.Mode{ResponseBody: gateway.Streamed, AllowModeOverride: true})
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		if _, err := x.ProcessRequest(gateway.Request{Headers: reqHeaders(nil)}); err != nil {
			t.Fatal(err)
		}
		w := &memWriter{}
		if err := x.ProcessResponse(gateway.Response{Headers: gateway.NewResponseHeaders(200, nil), Body: bodyOf("a", "b")}, w); err != nil {
			t.Fatal(err)
		}
		if w.body() != "AB" || x.Phase() != gateway.PhaseDone {
			t.Errorf("body %q phase %v", w.body(), x.Phase())
		}
		noViolations(t, x.Record())
	})
	t.Run("ignored with full duplex", func(t *testing.T) {
		reply := reqHeadersReply(nil)
		skipBody(reply)
		addr := replyOnce(t, reply, nil)
		c := newClient(t, addr, gateway.Mode{ResponseBody: gateway.FullDuplex, AllowModeOverride: true})
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		if _, err := x.ProcessRequest(gateway.Request{Headers: reqHeaders(nil)}); err != nil {
			t.Fatal(err)
		}
		if rec := x.Record(); rec.ModeOverrides != 0 || !rec.Has(gateway.ModeOverrideIgnored) {
			t.Errorf("override with full duplex configured: applied %d, violations %v", rec.ModeOverrides, rec.Violations)
		}
	})
}

func TestClearRouteCache(t *testing.T) {
	for _, tc := range []struct {
		name        string
		cr          *extprocv3.CommonResponse
		wantCleared bool
	}{
		{"with mutation", &extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: mutation(set("x-a", "1"))}, true},
		{"without mutation", &extprocv3.CommonResponse{ClearRouteCache: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := replyOnce(t, reqHeadersReply(tc.cr), nil)
			c := newClient(t, addr, gateway.Mode{})
			x := c.NewExchange(testCtx(t, 5*time.Second))
			defer x.Close()
			res, _ := x.ProcessRequest(gateway.Request{Headers: reqHeaders(nil)})
			if res.RouteCacheCleared != tc.wantCleared || x.Record().Has(gateway.RouteCacheClearIgnored) == tc.wantCleared {
				t.Errorf("cleared %v, violations %v", res.RouteCacheCleared, x.Record().Violations)
			}
		})
	}
}

// TestStreamedOneReplyPerChunk: one message per chunk, the next only after
// the reply; each reply's body mutation applies to its chunk; header
// mutations in STREAMED body replies do not apply.
func TestStreamedOneReplyPerChunk(t *testing.T) {
	addr := envoytest.StartServerFunc(t, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		for {
			req, err := s.Recv()
			if err != nil {
				return nil
			}
			reply := continueReply(req)
			if b := req.GetRequestBody(); b != nil {
				reply = reqBodyReply(&extprocv3.CommonResponse{
					HeaderMutation: mutation(set("x-late", "1")),
					BodyMutation:   &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: bytes.ToUpper(b.GetBody())}},
				})
			}
			if err := s.Send(reply); err != nil {
				return nil
			}
		}
	})
	c := newClient(t, addr, gateway.Mode{RequestBody: gateway.Streamed})
	x := c.NewExchange(testCtx(t, 5*time.Second))
	defer x.Close()
	res, err := x.ProcessRequest(gateway.Request{Headers: reqHeaders([]byte("abcdef")), Body: bodyOf("ab", "cd", "ef")})
	if err != nil || res.LocalReply != nil {
		t.Fatal(err, res.LocalReply)
	}
	rec := x.Record()
	if string(res.Body) != "ABCDEF" || res.Headers.Has("x-late") || res.Headers.Has("content-length") {
		t.Errorf("body %q headers %v", res.Body, res.Headers)
	}
	if rec.Sent != 4 || rec.Received != 4 || !rec.Has(gateway.HeaderMutationIgnored) {
		t.Errorf("sent %d received %d violations %v", rec.Sent, rec.Received, rec.Violations)
	}
}

// TestFullDuplexEcho plays Narwhal's full-duplex contract: the server reads
// the whole body before answering the headers, then echoes the body.
func TestFullDuplexEcho(t *testing.T) {
	echo := func(bodyFirst bool) func(extprocv3.ExternalProcessor_ProcessServer) error {
		return func(s extprocv3.ExternalProcessor_ProcessServer) error {
			var body []byte
			for {
				req, err := s.Recv()
				if err != nil {
					return nil
				}
				if b := req.GetRequestBody(); b != nil {
					body = append(body, b.GetBody()...)
					if b.GetEndOfStream() {
						break
					}
				}
			}
			if bodyFirst {
				_ = s.Send(reqBodyReply(streamed(string(body), true)))
				return holdUntilClosedNil(s)
			}
			if err := s.Send(reqHeadersReply(&extprocv3.CommonResponse{HeaderMutation: mutation(set(wire.HeaderDestination, "10.0.0.9:8000")), ClearRouteCache: true})); err != nil {
				return nil
			}
			half := len(body) / 2
			if err := s.Send(reqBodyReply(streamed(string(body[:half]), false))); err != nil {
				return nil
			}
			_ = s.Send(reqBodyReply(streamed(string(body[half:]), true)))
			return holdUntilClosedNil(s)
		}
	}
	mode := gateway.Mode{RequestBody: gateway.FullDuplex}

	t.Run("echo", func(t *testing.T) {
		c := newClient(t, envoytest.StartServerFunc(t, echo(false)), mode)
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		res, err := x.ProcessRequest(gateway.Request{Headers: reqHeaders([]byte("hello world")), Body: bodyOf("hello", " ", "world")})
		if err != nil || res.LocalReply != nil {
			t.Fatal(err, res.LocalReply)
		}
		if string(res.Body) != "hello world" || res.Headers.Get(wire.HeaderDestination) != "10.0.0.9:8000" || !res.RouteCacheCleared {
			t.Errorf("body %q headers %v", res.Body, res.Headers)
		}
		noViolations(t, x.Record())
	})
	t.Run("body reply before headers reply", func(t *testing.T) {
		c := newClient(t, envoytest.StartServerFunc(t, echo(true)), mode)
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		res, _ := x.ProcessRequest(gateway.Request{Headers: reqHeaders([]byte("abc")), Body: bodyOf("abc")})
		if res.LocalReply == nil || res.LocalReply.Status != 500 || !x.Record().Has(gateway.Spurious) {
			t.Fatalf("out-of-order full duplex reply: %+v", res.LocalReply)
		}
	})
	t.Run("mode validation", func(t *testing.T) {
		if err := (gateway.Mode{RequestBody: gateway.FullDuplex, FailureModeAllow: true}).Validate(); err == nil {
			t.Error("full duplex with failure_mode_allow accepted")
		}
	})
}

func TestServerEndsStream(t *testing.T) {
	t.Run("OK before replying", func(t *testing.T) {
		addr := envoytest.StartServerFunc(t, func(s extprocv3.ExternalProcessor_ProcessServer) error {
			_, _ = s.Recv()
			return nil
		})
		c := newClient(t, addr, gateway.Mode{RequestBody: gateway.Buffered})
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		res, err := x.ProcessRequest(gateway.Request{Headers: reqHeaders([]byte("{}")), Body: bodyOf("{}")})
		if err != nil || res.LocalReply != nil || x.Phase() != gateway.PhaseBypassed || string(res.Body) != "{}" {
			t.Fatalf("Envoy continues without the processor: err %v local %+v phase %v", err, res.LocalReply, x.Phase())
		}
		if !x.Record().Has(gateway.ServerClosed) {
			t.Error("early close not flagged")
		}
	})
	t.Run("error status", func(t *testing.T) {
		addr := envoytest.StartServerFunc(t, func(s extprocv3.ExternalProcessor_ProcessServer) error {
			_, _ = s.Recv()
			return status.Error(codes.Internal, "boom")
		})
		c := newClient(t, addr, gateway.Mode{})
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		res, _ := x.ProcessRequest(gateway.Request{Headers: reqHeaders(nil)})
		if lr := res.LocalReply; lr == nil || lr.Status != 500 || lr.Details != "ext_proc_error_gRPC_error_13{boom}" {
			t.Fatalf("local reply = %+v", lr)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		c := newClient(t, "127.0.0.1:1", gateway.Mode{})
		x := c.NewExchange(testCtx(t, 5*time.Second))
		defer x.Close()
		res, _ := x.ProcessRequest(gateway.Request{Headers: reqHeaders(nil)})
		if lr := res.LocalReply; lr == nil || lr.Status != 500 || !strings.HasPrefix(lr.Details, "ext_proc_error_gRPC_error_14") {
			t.Fatalf("local reply = %+v", lr)
		}
	})
}

func TestClientCancelResetsStream(t *testing.T) {
	received := make(chan struct{})
	ended := make(chan error, 1)
	addr := envoytest.StartServerFunc(t, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		if _, err := s.Recv(); err != nil {
			return nil
		}
		close(received)
		ended <- holdUntilClosed(s) // holds the reply, as for a waiting request
		return nil
	})
	c := newClient(t, addr, gateway.Mode{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	x := c.NewExchange(ctx)
	defer x.Close()
	go func() {
		<-received
		cancel()
	}()
	_, err := x.ProcessRequest(gateway.Request{Headers: reqHeaders(nil)})
	if !errors.Is(err, gateway.ErrCancelled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("ProcessRequest = %v, want cancellation", err)
	}
	if !x.Record().Cancelled || x.Phase() != gateway.PhaseCancelled {
		t.Errorf("record: cancelled %v phase %v", x.Record().Cancelled, x.Phase())
	}
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("server saw %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("server never saw the stream end")
	}
}

func TestBufferLimit(t *testing.T) {
	addr, null := envoytest.StartNullServer(t)
	c := newClient(t, addr, gateway.Mode{RequestBody: gateway.Buffered, BufferLimit: 1024})
	x := c.NewExchange(testCtx(t, 5*time.Second))
	defer x.Close()
	body := strings.Repeat("x", 2048)
	res, _ := x.ProcessRequest(gateway.Request{Headers: reqHeaders([]byte(body)), Body: strings.NewReader(body)})
	if lr := res.LocalReply; lr == nil || lr.Status != 413 || lr.FromProcessor {
		t.Fatalf("local reply = %+v, want Envoy's own 413", lr)
	}
	if null.Messages() != 1 {
		t.Errorf("server got %d messages, want only the headers", null.Messages())
	}
}

func TestContentLengthMismatch(t *testing.T) {
	addr := envoytest.StartServerFunc(t, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		for {
			req, err := s.Recv()
			if err != nil {
				return nil
			}
			reply := continueReply(req)
			if req.GetRequestBody() != nil {
				reply = reqBodyReply(&extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte("longer body")}}})
			}
			if err := s.Send(reply); err != nil {
				return nil
			}
		}
	})
	c := newClient(t, addr, gateway.Mode{RequestBody: gateway.Buffered})
	x := c.NewExchange(testCtx(t, 5*time.Second))
	defer x.Close()
	res, _ := x.ProcessRequest(gateway.Request{Headers: reqHeaders([]byte("{}")), Body: bodyOf("{}")})
	if res.LocalReply == nil || res.LocalReply.Status != 500 || !x.Record().Has(gateway.ContentLengthMismatch) {
		t.Fatalf("local reply = %+v", res.LocalReply)
	}
}

func TestNullServerRoundTrip(t *testing.T) {
	for _, mode := range []gateway.Mode{
		{RequestBody: gateway.Buffered, ResponseBody: gateway.Streamed},
		{RequestBody: gateway.FullDuplex, ResponseBody: gateway.FullDuplex},
		{RequestBody: gateway.Streamed, ResponseBody: gateway.Buffered},
		{},
	} {
		t.Run(fmt.Sprintf("%v-%v", mode.RequestBody, mode.ResponseBody), func(t *testing.T) {
			addr, null := envoytest.StartNullServer(t)
			c := newClient(t, addr, mode)
			x := c.NewExchange(testCtx(t, 5*time.Second))
			res, err := x.ProcessRequest(gateway.Request{Headers: reqHeaders([]byte(`{"p":1}`)), Body: bodyOf(`{"p"`, `:1}`)})
			if err != nil || res.LocalReply != nil || string(res.Body) != `{"p":1}` {
				t.Fatalf("request: %v %+v %q", err, res.LocalReply, res.Body)
			}
			w := &memWriter{}
			err = x.ProcessResponse(gateway.Response{
				Headers: gateway.NewResponseHeaders(200, map[string][]string{"Content-Type": {"text/event-stream"}}),
				Body:    bodyOf("data: a\n\n", "data: b\n\n", "data: [DONE]\n\n"),
			}, w)
			if err != nil {
				t.Fatal(err)
			}
			x.Close()
			if w.headers.Status() != 200 || w.body() != "data: a\n\ndata: b\n\ndata: [DONE]\n\n" {
				t.Errorf("response %v %q", w.headers, w.body())
			}
			rec := x.Record()
			noViolations(t, rec)
			if null.Streams() != 1 || rec.Phase != gateway.PhaseDone {
				t.Errorf("streams %d phase %v", null.Streams(), rec.Phase)
			}
		})
	}
}
