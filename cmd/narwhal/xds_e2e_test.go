package main

import (
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// adsWatch opens a state-of-the-world ADS stream to a running narwhal serve, subscribes to
// the three role clusters' endpoints, ACKs every response, and sends each assignment set it
// receives (cluster name -> endpoint id -> health status name) on the returned channel.
func adsWatch(t *testing.T, addr string) <-chan map[string]map[string]string {
	t.Helper()
	return adsWatchAs(t, addr, "", grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// adsWatchAs is adsWatch as node (its id on the first request), over opts' transport.
func adsWatchAs(t *testing.T, addr, node string, opts ...grpc.DialOption) <-chan map[string]map[string]string {
	t.Helper()
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); _ = conn.Close() })
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"narwhal-prefill", "narwhal-decode", "narwhal-engines"}
	req := &discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: names}
	if node != "" {
		req.Node = &corev3.Node{Id: node}
	}
	if err := stream.Send(req); err != nil {
		t.Fatal(err)
	}
	out := make(chan map[string]map[string]string, 16)
	go func() {
		defer close(out)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			got := map[string]map[string]string{}
			for _, a := range resp.GetResources() {
				var cla endpointv3.ClusterLoadAssignment
				if err := a.UnmarshalTo(&cla); err != nil {
					return
				}
				got[cla.GetClusterName()] = map[string]string{}
				for _, le := range cla.GetEndpoints() {
					for _, ep := range le.GetLbEndpoints() {
						id := ep.GetMetadata().GetFilterMetadata()["narwhal"].GetFields()["engine_id"].GetStringValue()
						got[cla.GetClusterName()][id] = ep.GetHealthStatus().String()
					}
				}
			}
			out <- got
			ack := &discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: names,
				VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
			if stream.Send(ack) != nil {
				return
			}
		}
	}()
	return out
}

// awaitEDS reads assignment sets until cond holds.
func awaitEDS(t *testing.T, ch <-chan map[string]map[string]string, what string, cond func(map[string]map[string]string) bool) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case got, ok := <-ch:
			if !ok {
				t.Fatalf("%s: the ADS stream ended", what)
			}
			if cond(got) {
				return
			}
		case <-timeout:
			t.Fatalf("%s: no such EDS push within 10 s", what)
		}
	}
}

// TestServeXDSEndToEnd: an ADS client of a real narwhal serve sees the fleet, then sees a health
// failure and an operator drain arrive as new EDS versions.
func TestServeXDSEndToEnd(t *testing.T) {
	procs, engines := startEngines(t, "prefill", "prefill", "decode", "decode")
	admin, _, xdsAddr := start(t, "serve", "--config", writeConfig(t, e2eConfig(anyPort, anyPort, anyPort, engines))).serving(t)
	waitFor(t, admin, 10*time.Second, "four active engines", allActive(4))
	eds := adsWatch(t, xdsAddr)
	awaitEDS(t, eds, "initial assignments", func(g map[string]map[string]string) bool {
		return len(g["narwhal-prefill"]) == 2 && len(g["narwhal-decode"]) == 2 && len(g["narwhal-engines"]) == 4 &&
			g["narwhal-decode"]["e3"] == "HEALTHY"
	})
	_ = procs[2].cmd.Process.Kill()
	_ = procs[2].cmd.Wait()
	awaitEDS(t, eds, "e3 unhealthy", func(g map[string]map[string]string) bool {
		return g["narwhal-decode"]["e3"] == "UNHEALTHY" && g["narwhal-engines"]["e3"] == "UNHEALTHY"
	})
	// e4 is now the last live decode engine: its drain is refused (the decode floor) unless forced.
	if resp, err := httpPost("http://" + admin + "/narwhal/engines/e4/drain"); err != nil || resp != 409 {
		t.Fatalf("drain of the last live decode engine: %d %v, want 409", resp, err)
	}
	resp, err := httpPost("http://" + admin + "/narwhal/engines/e4/drain?force=true")
	if err != nil || resp != 200 {
		t.Fatalf("forced drain: %d %v", resp, err)
	}
	awaitEDS(t, eds, "e4 draining", func(g map[string]map[string]string) bool {
		return g["narwhal-decode"]["e4"] == "DRAINING" && g["narwhal-engines"]["e4"] == "DRAINING"
	})
}
