package envoy

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/xds"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/internal/poll"
	"github.com/narwhal-llm/narwhal/wire"
)

// testEngine is a small gRPC server (the health service) standing in for an engine; it counts
// the calls it serves.
type testEngine struct {
	addr  string
	calls atomic.Int64
}

func startEngines(t *testing.T, n int) []*testEngine {
	t.Helper()
	var engines []*testEngine
	var wg sync.WaitGroup
	var servers []*grpc.Server
	for range n {
		e := &testEngine{}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		e.addr = lis.Addr().String()
		g := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			e.calls.Add(1)
			return h(ctx, req)
		}))
		healthpb.RegisterHealthServer(g, health.NewServer())
		wg.Go(func() { _ = g.Serve(lis) })
		engines = append(engines, e)
		servers = append(servers, g)
	}
	t.Cleanup(func() {
		for _, g := range servers {
			g.Stop()
		}
		wg.Wait()
	})
	return engines
}

func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// withTestRoute adds, through the server's own cache, the test-only resources grpc-go's xDS
// client starts from: an API listener for target and its route configuration, which sends
// everything to cluster.
func withTestRoute(t *testing.T, target, cluster string) func(*Server) {
	return func(s *Server) {
		routeName := target + "-route"
		hcm := &hcmv3.HttpConnectionManager{
			RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
				ConfigSource: &corev3.ConfigSource{
					ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
					ResourceApiVersion:    corev3.ApiVersion_V3,
				},
				RouteConfigName: routeName,
			}},
			HttpFilters: []*hcmv3.HttpFilter{{Name: "router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &routerv3.Router{})}}},
		}
		lis := &listenerv3.Listener{Name: target, ApiListener: &listenerv3.ApiListener{ApiListener: mustAny(t, hcm)}}
		route := &routev3.RouteConfiguration{Name: routeName, VirtualHosts: []*routev3.VirtualHost{{
			Name: "all", Domains: []string{"*"},
			Routes: []*routev3.Route{{
				Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster}}},
			}},
		}}}
		for typeURL, r := range map[string]types.Resource{resource.ListenerType: lis, resource.RouteType: route} {
			if err := r.(interface{ ValidateAll() error }).ValidateAll(); err != nil {
				t.Fatal(err)
			}
			s.mux.Caches[typeURL] = cache.NewLinearCache(typeURL, cache.WithInitialResources(map[string]types.Resource{cache.GetResourceName(r): r}))
		}
	}
}

// TestGRPCXDSClient: grpc-go's own xDS client accepts every resource (no NACK) and balances
// calls over the healthy engines of the decode cluster; after a role move it stops using the
// moved engine.
func TestGRPCXDSClient(t *testing.T) {
	eng := startEngines(t, 4)
	// e1 prefill, e2 and e3 decode, e4 decode but drained: only e2 and e3 take calls.
	f := newTestFleet(t,
		engineSpec{"e1", eng[0].addr, "prefill", false},
		engineSpec{"e2", eng[1].addr, "decode", false},
		engineSpec{"e3", eng[2].addr, "decode", false},
		engineSpec{"e4", eng[3].addr, "decode", false},
	)
	mustEngine(t)(f.Drain("e4", xdsEpoch, "admin", fleet.Floors{}))
	ts := startServer(t, f, withTestRoute(t, "narwhal-test", wire.Names("narwhal").Decode))

	bootstrap := fmt.Sprintf(`{
		"xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
		"node": {"id": "grpc-go-test", "locality": {"region": "narwhal"}}
	}`, ts.addr)
	builder, err := xds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("xds:///narwhal-test", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(builder))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := healthpb.NewHealthClient(cc)

	// calls makes n calls and returns how many each engine served.
	calls := func(n int) [4]int64 {
		t.Helper()
		var before [4]int64
		for i, e := range eng {
			before[i] = e.calls.Load()
		}
		for range n {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
			cancel()
			if err != nil {
				t.Fatalf("call through xds: %v (server logs:\n%s)", err, ts.logs.String())
			}
		}
		var out [4]int64
		for i, e := range eng {
			out[i] = e.calls.Load() - before[i]
		}
		return out
	}
	if got := calls(40); got[0] != 0 || got[1] == 0 || got[2] == 0 || got[3] != 0 {
		t.Fatalf("calls per engine %v: want some on e2 and e3 (healthy decode), none on e1 (prefill) or e4 (draining)", got)
	}

	mustEngine(t)(f.SetRole("e3", fleet.Prefill, xdsEpoch, "decision 1"))
	var got [4]int64
	if !poll.Within(10*time.Second, func() bool { got = calls(10); return got[2] == 0 }) {
		t.Fatalf("e3 still takes decode calls 10s after moving to prefill: %v", got)
	}
	if got := calls(40); got != [4]int64{0, 40, 0, 0} {
		t.Fatalf("calls per engine after the move %v: want all on e2", got)
	}
	st := ts.Stats()
	if st.Nacks != 0 || strings.Contains(ts.logs.String(), "rejected") {
		t.Fatalf("grpc-go rejected a resource: %+v\n%s", st, ts.logs.String())
	}
	if st.Clients != 1 {
		t.Fatalf("stats %+v: want grpc-go's one ADS stream", st)
	}
}
