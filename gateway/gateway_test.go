package gateway_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/narwhal-llm/narwhal/extproc/envoytest"
	"github.com/narwhal-llm/narwhal/gateway"
	"github.com/narwhal-llm/narwhal/wire"
)

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`

// placementServer answers as Narwhal's contract says: it places every
// request on dst (header mutation with clear_route_cache, envoy.lb
// metadata) in the BUFFERED body reply, or in full duplex holds the headers
// reply until it has read the body and then echoes the body; response
// headers and chunks are acknowledged unchanged. ended gets how each stream
// ended.
func placementServer(t *testing.T, dst string, ended chan<- error) string {
	md, err := structpb.NewStruct(map[string]any{"envoy.lb": map[string]any{wire.HeaderDestination: dst}})
	if err != nil {
		t.Fatal(err)
	}
	place := func() *extprocv3.CommonResponse {
		return &extprocv3.CommonResponse{
			HeaderMutation:  mutation(set(wire.HeaderDestination, dst), set("x-narwhal-placement", "aggregate")),
			ClearRouteCache: true,
		}
	}
	return envoytest.StartServerFunc(t, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		var reqDuplex, respDuplex bool
		var held []byte
		for {
			req, err := s.Recv()
			if err != nil {
				break
			}
			if pc := req.GetProtocolConfig(); pc != nil {
				reqDuplex = pc.GetRequestBodyMode() == gateway.FullDuplex
				respDuplex = pc.GetResponseBodyMode() == gateway.FullDuplex
			}
			var replies []*extprocv3.ProcessingResponse
			switch {
			case req.GetRequestHeaders() != nil:
				if !reqDuplex || req.GetRequestHeaders().GetEndOfStream() {
					replies = append(replies, reqHeadersReply(nil))
				}
			case req.GetRequestBody() != nil:
				b := req.GetRequestBody()
				if !reqDuplex {
					r := reqBodyReply(place())
					r.DynamicMetadata = md
					replies = append(replies, r)
					break
				}
				held = append(held, b.GetBody()...)
				if b.GetEndOfStream() {
					r := reqHeadersReply(place())
					r.DynamicMetadata = md
					replies = append(replies, r, reqBodyReply(streamed(string(held), true)))
				}
			case req.GetResponseHeaders() != nil:
				replies = append(replies, respHeadersReply(nil))
			case req.GetResponseBody() != nil:
				b := req.GetResponseBody()
				if respDuplex {
					replies = append(replies, respBodyReply(streamed(string(b.GetBody()), b.GetEndOfStream())))
				} else {
					replies = append(replies, respBodyReply(nil))
				}
			}
			for _, r := range replies {
				if err := s.Send(r); err != nil {
					break
				}
			}
		}
		if ended != nil {
			select {
			case <-s.Context().Done():
				ended <- s.Context().Err()
			case <-time.After(5 * time.Second):
				ended <- nil
			}
		}
		return nil
	})
}

// sseEngine is an upstream that streams two SSE events, the second only
// once release is closed; it checks the placement header and the body.
func sseEngine(t *testing.T, release <-chan struct{}, cancelled chan<- struct{}) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Header.Get("X-Narwhal-Placement") != "aggregate" || string(body) != chatBody {
			http.Error(w, fmt.Sprintf("placement %q body %q", r.Header.Get("X-Narwhal-Placement"), body), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			if cancelled != nil {
				close(cancelled)
			}
			return
		}
		fmt.Fprint(w, "data: 2\n\n")
		w.(http.Flusher).Flush()
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv
}

func chatRequest(t *testing.T, ctx context.Context, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	// A client trying to pick its engine: the processor must overwrite it.
	req.Header.Set(wire.HeaderDestination, "10.255.255.1:1")
	return req
}

// readEvent reads one SSE event (up to the blank line) or fails after 5 s.
func readEvent(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		var ev strings.Builder
		for {
			line, err := br.ReadString('\n')
			ev.WriteString(line)
			if err != nil || line == "\n" {
				got <- ev.String()
				return
			}
		}
	}()
	select {
	case ev := <-got:
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no SSE event within 5 s: the gateway does not stream")
		return ""
	}
}

func TestGatewayStreamsSSE(t *testing.T) {
	for _, mode := range []gateway.Mode{
		{RequestBody: gateway.Buffered, ResponseBody: gateway.Streamed, ReceivingNamespaces: []string{"envoy.lb"}},
		{RequestBody: gateway.FullDuplex, ResponseBody: gateway.FullDuplex, ReceivingNamespaces: []string{"envoy.lb"}},
	} {
		t.Run(fmt.Sprintf("%v-%v", mode.RequestBody, mode.ResponseBody), func(t *testing.T) {
			release := make(chan struct{})
			engine := sseEngine(t, release, nil)
			engineAddr := strings.TrimPrefix(engine.URL, "http://")
			gw, srv := envoytest.StartGateway(t, placementServer(t, engineAddr, nil), relaxed(mode))

			ctx := testCtx(t, 10*time.Second)
			resp, err := srv.Client().Do(chatRequest(t, ctx, srv.URL))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
			}
			br := bufio.NewReader(resp.Body)
			// The first event must arrive while the engine is still
			// streaming (it waits for release).
			if ev := readEvent(t, br); ev != "data: 1\n\n" {
				t.Fatalf("first event %q", ev)
			}
			close(release)
			rest, err := io.ReadAll(br)
			if err != nil || string(rest) != "data: 2\n\ndata: [DONE]\n\n" {
				t.Fatalf("rest %q, %v", rest, err)
			}

			ocs, err := gw.WaitOutcomes(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			oc := ocs[0]
			if oc.Route != gateway.RouteOriginalDst || oc.Upstream != engineAddr || oc.Status != 200 || oc.Cancelled || oc.Reset {
				t.Errorf("outcome %+v", oc)
			}
			if got := oc.Placement.Get("X-Narwhal-Placement"); got != "aggregate" || oc.Destination != engineAddr {
				t.Errorf("placement %v destination %q", oc.Placement, oc.Destination)
			}
			rec := oc.Record
			noViolations(t, rec)
			if rec.Metadata("envoy.lb", wire.HeaderDestination) != engineAddr || !rec.RouteCacheCleared || rec.Phase != gateway.PhaseDone {
				t.Errorf("record: metadata %v cleared %v phase %v", rec.DynamicMetadata, rec.RouteCacheCleared, rec.Phase)
			}
			if oc.Chunks < 2 {
				t.Errorf("%d chunks written, want each event flushed", oc.Chunks)
			}
		})
	}
}

func TestGatewayClientCancel(t *testing.T) {
	release := make(chan struct{}) // never closed: the engine streams until cancelled
	upstreamCancelled := make(chan struct{})
	engine := sseEngine(t, release, upstreamCancelled)
	engineAddr := strings.TrimPrefix(engine.URL, "http://")
	ended := make(chan error, 1)
	mode := gateway.Mode{RequestBody: gateway.Buffered, ResponseBody: gateway.Streamed}
	gw, srv := envoytest.StartGateway(t, placementServer(t, engineAddr, ended), relaxed(mode))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := srv.Client().Do(chatRequest(t, ctx, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	if ev := readEvent(t, bufio.NewReader(resp.Body)); ev != "data: 1\n\n" {
		t.Fatalf("first event %q", ev)
	}
	cancel()
	resp.Body.Close()

	select {
	case <-upstreamCancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream request was not cancelled")
	}
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("ext_proc stream ended with %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the ext_proc stream was not closed")
	}
	ocs, err := gw.WaitOutcomes(testCtx(t, 5*time.Second), 1)
	if err != nil {
		t.Fatal(err)
	}
	if oc := ocs[0]; !oc.Cancelled || !oc.Record.Cancelled {
		t.Errorf("outcome not cancelled: %+v", oc)
	}
}

func TestGatewayRouting(t *testing.T) {
	named := func(name string) (*httptest.Server, string) {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, name)
		}))
		t.Cleanup(s.Close)
		return s, strings.TrimPrefix(s.URL, "http://")
	}
	_, engineAddr := named("engine")
	_, defaultAddr := named("default")
	addr, _ := envoytest.StartNullServer(t)
	mode := gateway.Mode{RequestBody: gateway.Buffered, ResponseBody: gateway.Streamed}
	gw, srv := envoytest.StartGateway(t, addr, relaxed(mode), gateway.WithDefaultUpstream(defaultAddr))
	_, bare := envoytest.StartGateway(t, addr, relaxed(mode))

	cases := []struct {
		name       string
		srv        *httptest.Server
		path, dest string
		status     int
		body       string
		route      gateway.Route
	}{
		{"no destination", srv, "/v1/completions", "", 503, "no healthy upstream", gateway.RouteOriginalDst},
		{"host name is not an IP", srv, "/v1/completions", "engine.local:8000", 503, "no healthy upstream", gateway.RouteOriginalDst},
		// The header is not sanitised: a processor that does not overwrite
		// it lets the client choose (the null server changes nothing).
		{"client-supplied destination", srv, "/v1/completions", engineAddr, 200, "engine", gateway.RouteOriginalDst},
		{"unreachable engine", srv, "/v1/completions", "127.0.0.1:1", 503, "upstream connect error or disconnect/reset before headers. reset reason: connection failure", gateway.RouteOriginalDst},
		{"unprocessed path to default", srv, "/health", engineAddr, 200, "default", gateway.RouteDefault},
		{"unprocessed path, no default", bare, "/health", engineAddr, 404, "", gateway.RouteNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(testCtx(t, 10*time.Second), http.MethodPost, tc.srv.URL+tc.path, strings.NewReader("{}"))
			if tc.dest != "" {
				req.Header.Set(wire.HeaderDestination, tc.dest)
			}
			resp, err := tc.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || string(b) != tc.body {
				t.Fatalf("got %d %q, want %d %q", resp.StatusCode, b, tc.status, tc.body)
			}
		})
	}
	ocs, err := gw.WaitOutcomes(testCtx(t, 5*time.Second), 5)
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range cases[:5] {
		if ocs[i].Route != tc.route {
			t.Errorf("%s: route %q, want %q", tc.name, ocs[i].Route, tc.route)
		}
		noViolations(t, ocs[i].Record)
	}
	if !ocs[0].RouterReply || ocs[3].UpstreamError == nil || ocs[2].Upstream != engineAddr {
		t.Errorf("outcomes %+v", ocs)
	}
}

func TestGatewayLocalReply(t *testing.T) {
	addr := replyOnce(t, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{}}}, nil)
	gw, srv := envoytest.StartGateway(t, addr, relaxed(gateway.Mode{RequestBody: gateway.Buffered}))
	resp, err := srv.Client().Post(srv.URL+"/v1/completions", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("status %d, want Envoy's defaulted 200", resp.StatusCode)
	}
	ocs, _ := gw.WaitOutcomes(testCtx(t, 5*time.Second), 1)
	if lr := ocs[0].LocalReply; lr == nil || !ocs[0].Record.Has(gateway.ImmediateStatusDefaulted) || ocs[0].Route != gateway.RouteNone {
		t.Errorf("outcome %+v", ocs[0])
	}
}
