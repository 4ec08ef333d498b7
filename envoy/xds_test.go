package envoy

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/internal/logbuf"
	"github.com/narwhal-llm/narwhal/internal/poll"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type testServer struct {
	*Server
	addr string
	reg  *prometheus.Registry
	logs *logbuf.Buffer
}

// startServer serves f's xDS on 127.0.0.1:0 and follows the fleet until the test ends. setup
// runs before the server listens (tests add test-only resource types there).
func startServer(t testing.TB, f *fleet.Fleet, setup ...func(*Server)) *testServer {
	t.Helper()
	ts := &testServer{reg: prometheus.NewRegistry(), logs: &logbuf.Buffer{}}
	log := slog.New(slog.NewTextHandler(ts.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, cancel := context.WithCancel(context.Background())
	ts.Server = NewServer(ctx, "narwhal", f, log, ts.reg)
	for _, fn := range setup {
		fn(ts.Server)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts.addr = lis.Addr().String()
	g := grpc.NewServer(ServerOptions()...)
	ts.Register(g)
	var wg sync.WaitGroup
	wg.Go(func() { _ = g.Serve(lis) })
	wg.Go(func() { _ = ts.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		g.Stop()
		wg.Wait()
	})
	return ts
}

var allNames = []string{"narwhal-prefill", "narwhal-decode", "narwhal-engines"}

// sotwClient is a raw state-of-the-world ADS client: the test sends each request and reads
// each response itself.
type sotwClient struct {
	t      testing.TB
	conn   *grpc.ClientConn
	cancel context.CancelFunc
	stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	resps  chan *discovery.DiscoveryResponse
	done   chan struct{}
	err    error // why the stream ended, once done is closed
	node   *corev3.Node
}

func dialConn(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

func dialSotw(t testing.TB, addr, node string) *sotwClient {
	t.Helper()
	c := &sotwClient{t: t, conn: dialConn(t, addr), resps: make(chan *discovery.DiscoveryResponse, 1024),
		done: make(chan struct{}), node: &corev3.Node{Id: node, Cluster: "test"}}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	var err error
	if c.stream, err = discovery.NewAggregatedDiscoveryServiceClient(c.conn).StreamAggregatedResources(ctx); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.done)
		for {
			r, err := c.stream.Recv()
			if err != nil {
				c.err = err
				return
			}
			c.resps <- r
		}
	}()
	t.Cleanup(c.close)
	return c
}

func (c *sotwClient) close() {
	c.cancel()
	<-c.done
	_ = c.conn.Close()
}

// send sends a request; the node goes on the first one only, as Envoy does.
func (c *sotwClient) send(req *discovery.DiscoveryRequest) {
	c.t.Helper()
	if c.node != nil {
		req.Node, c.node = c.node, nil
	}
	if err := c.stream.Send(req); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

func (c *sotwClient) subscribe(typeURL string, names ...string) {
	c.send(&discovery.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names})
}

// ack accepts r, naming the same resources as the subscription did.
func (c *sotwClient) ack(r *discovery.DiscoveryResponse, names ...string) {
	c.send(&discovery.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce(), ResourceNames: names})
}

func (c *sotwClient) next() *discovery.DiscoveryResponse { c.t.Helper(); return nextOf(c.t, c.resps) }

// quiet returns the responses that arrive within d.
func (c *sotwClient) quiet(d time.Duration) []*discovery.DiscoveryResponse {
	return quietOf(c.resps, d)
}

// nextOf waits up to 5 s for one response.
func nextOf[R any](t testing.TB, ch <-chan R) R {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("no response within 5s")
		var zero R
		return zero
	}
}

// quietOf returns the responses that arrive within d.
func quietOf[R any](ch <-chan R, d time.Duration) []R {
	var out []R
	timeout := time.After(d)
	for {
		select {
		case r := <-ch:
			out = append(out, r)
		case <-timeout:
			return out
		}
	}
}

// edsState is what a client knows of the assignments.
type edsState map[string]*endpointv3.ClusterLoadAssignment

func (s edsState) apply(t testing.TB, resources []*anypb.Any) []string {
	t.Helper()
	var names []string
	for _, a := range resources {
		cla := &endpointv3.ClusterLoadAssignment{}
		if err := a.UnmarshalTo(cla); err != nil {
			t.Fatal(err)
		}
		s[cla.GetClusterName()] = cla
		names = append(names, cla.GetClusterName())
	}
	slices.Sort(names)
	return names
}

// check compares the client's assignments with the contract's translation of the fleet.
func (s edsState) check(t testing.TB, f *fleet.Fleet) {
	t.Helper()
	snap := f.Snapshot()
	for i, name := range allNames {
		if s[name] == nil {
			t.Fatalf("no assignment %s", name)
		}
		checkViews(t, viewCLA(t, s[name]), expectedViews(&snap, i))
	}
}

func clusterNames(t testing.TB, resources []*anypb.Any) []string {
	t.Helper()
	var names []string
	for _, a := range resources {
		c := &clusterv3.Cluster{}
		if err := a.UnmarshalTo(c); err != nil {
			t.Fatal(err)
		}
		if err := c.ValidateAll(); err != nil {
			t.Fatal(err)
		}
		names = append(names, c.GetName())
	}
	slices.Sort(names)
	return names
}

// testFleet: e1 prefill, e2 decode, e3 decode, e4 prefill pinned.
func testFleet(t testing.TB) *fleet.Fleet {
	return newTestFleet(t,
		engineSpec{"e1", "10.0.0.1:8000", "prefill", false},
		engineSpec{"e2", "10.0.0.2:8000", "decode", false},
		engineSpec{"e3", "10.0.0.3:8000", "decode", false},
		engineSpec{"e4", "10.0.0.4:8000", "prefill", true},
	)
}

// fleetChanges are the changes the protocol tests apply, with the assignments each changes.
func fleetChanges(t testing.TB, f *fleet.Fleet) []struct {
	name   string
	apply  func()
	change []string
} {
	return []struct {
		name   string
		apply  func()
		change []string
	}{
		{"drain e3", func() { mustEngine(t)(f.Drain("e3", xdsEpoch, "admin", fleet.Floors{})) }, []string{"narwhal-decode", "narwhal-engines"}},
		{"unpin e4", func() { mustEngine(t)(f.SetPinned("e4", false, xdsEpoch, "admin")) }, []string{"narwhal-engines", "narwhal-prefill"}},
		{"move e4 to decode", func() { mustEngine(t)(f.SetRole("e4", fleet.Decode, xdsEpoch, "decision 1")) }, allSorted},
		{"pin e2", func() { mustEngine(t)(f.SetPinned("e2", true, xdsEpoch, "admin")) }, []string{"narwhal-decode", "narwhal-engines"}},
	}
}

var allSorted = []string{"narwhal-decode", "narwhal-engines", "narwhal-prefill"}

// TestSotW: a state-of-the-world client gets the three clusters and the three assignments
// with role metadata and health; each fleet change (drain, unpin, role move, pin) arrives as
// one new EDS version with the assignments it changed, and CDS is never pushed again.
func TestSotW(t *testing.T) {
	f := testFleet(t)
	ts := startServer(t, f)
	c := dialSotw(t, ts.addr, "envoy-1")

	c.subscribe(resource.ClusterType)
	r := c.next()
	if r.GetTypeUrl() != resource.ClusterType || r.GetVersionInfo() != "cds-1" || r.GetNonce() == "" {
		t.Fatalf("first response %s version %q nonce %q", r.GetTypeUrl(), r.GetVersionInfo(), r.GetNonce())
	}
	if got := clusterNames(t, r.GetResources()); !slices.Equal(got, allSorted) {
		t.Fatalf("clusters %v", got)
	}
	c.ack(r)
	c.subscribe(resource.EndpointType, allNames...)
	r = c.next()
	state := edsState{}
	if r.GetTypeUrl() != resource.EndpointType || r.GetVersionInfo() != "eds-1" {
		t.Fatalf("EDS response %s version %q", r.GetTypeUrl(), r.GetVersionInfo())
	}
	if got := state.apply(t, r.GetResources()); !slices.Equal(got, allSorted) {
		t.Fatalf("assignments %v", got)
	}
	state.check(t, f)
	c.ack(r, allNames...)

	for i, ch := range fleetChanges(t, f) {
		ch.apply()
		r := c.next()
		want := fmt.Sprintf("eds-%d", i+2)
		if r.GetTypeUrl() != resource.EndpointType || r.GetVersionInfo() != want {
			t.Fatalf("%s: got %s version %q, want EDS %s", ch.name, r.GetTypeUrl(), r.GetVersionInfo(), want)
		}
		if got := state.apply(t, r.GetResources()); !slices.Equal(got, ch.change) {
			t.Fatalf("%s: assignments %v, want %v", ch.name, got, ch.change)
		}
		state.check(t, f)
		if st := ts.Stats(); st.Version != want || st.FleetVersion != f.Version() {
			t.Fatalf("%s: stats %+v, fleet version %d", ch.name, st, f.Version())
		}
		c.ack(r, allNames...)
	}
	// One version per change: nothing else follows, and CDS was pushed once.
	if extra := c.quiet(300 * time.Millisecond); len(extra) != 0 {
		t.Fatalf("%d responses after the last change (first %s %s)", len(extra), extra[0].GetTypeUrl(), extra[0].GetVersionInfo())
	}
	st := ts.Stats()
	if st.Clients != 1 || st.Pushes != 6 || st.Nacks != 0 || st.Version != "eds-5" {
		t.Fatalf("stats %+v", st)
	}
	if cds, eds := metricValue(t, ts.metrics.pushes.WithLabelValues("cds")), metricValue(t, ts.metrics.pushes.WithLabelValues("eds")); cds != 1 || eds != 5 {
		t.Fatalf("pushes: cds %v eds %v", cds, eds)
	}
	if v := metricValue(t, ts.metrics.version); v != float64(f.Version()) {
		t.Fatalf("narwhal_xds_version %v, fleet %d", v, f.Version())
	}
	if got := metricSeries(t, ts.reg); got != "narwhal_xds_clients 1, narwhal_xds_nacks_total{type=cds} 0, narwhal_xds_nacks_total{type=eds} 0, "+
		"narwhal_xds_pushes_total{type=cds} 1, narwhal_xds_pushes_total{type=eds} 5, narwhal_xds_refused_total 0, narwhal_xds_version 5" {
		t.Fatalf("metrics: %s", got)
	}
	// A fleet change that changes no assignment (an undrain: e3 stays draining) publishes nothing.
	mustEngine(t)(f.Undrain("e3", xdsEpoch, "admin"))
	if extra := c.quiet(200 * time.Millisecond); len(extra) != 0 || ts.Stats().Version != "eds-5" {
		t.Fatalf("an undrain that changes no assignment pushed %d responses, version %s", len(extra), ts.Stats().Version)
	}
	c.close()
	poll.Until(t, 10*time.Second, "the client to be gone", func() bool { return ts.Stats().Clients == 0 })
}

// metricValue reads the one metric of a collector.
func metricValue(t testing.TB, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var m dto.Metric
	if err := (<-ch).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue() + m.GetGauge().GetValue()
}

// metricSeries lists every metric of reg as "name{label=value} value".
func metricSeries(t testing.TB, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			s := mf.GetName()
			for _, l := range m.GetLabel() {
				s += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			out = append(out, fmt.Sprintf("%s %v", s, m.GetCounter().GetValue()+m.GetGauge().GetValue()))
		}
	}
	return strings.Join(out, ", ")
}

// deltaClient is a raw delta ADS client.
type deltaClient struct {
	t      testing.TB
	conn   *grpc.ClientConn
	cancel context.CancelFunc
	stream discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	resps  chan *discovery.DeltaDiscoveryResponse
	done   chan struct{}
	err    error // why the stream ended, once done is closed
	node   *corev3.Node
}

func dialDelta(t testing.TB, addr, node string) *deltaClient {
	t.Helper()
	c := &deltaClient{t: t, conn: dialConn(t, addr), resps: make(chan *discovery.DeltaDiscoveryResponse, 1024),
		done: make(chan struct{}), node: &corev3.Node{Id: node}}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	var err error
	if c.stream, err = discovery.NewAggregatedDiscoveryServiceClient(c.conn).DeltaAggregatedResources(ctx); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.done)
		for {
			r, err := c.stream.Recv()
			if err != nil {
				c.err = err
				return
			}
			c.resps <- r
		}
	}()
	t.Cleanup(func() { c.cancel(); <-c.done; _ = c.conn.Close() })
	return c
}

func (c *deltaClient) send(req *discovery.DeltaDiscoveryRequest) {
	c.t.Helper()
	if c.node != nil {
		req.Node, c.node = c.node, nil
	}
	if err := c.stream.Send(req); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

func (c *deltaClient) next() *discovery.DeltaDiscoveryResponse {
	c.t.Helper()
	return nextOf(c.t, c.resps)
}

func (c *deltaClient) quiet(d time.Duration) []*discovery.DeltaDiscoveryResponse {
	return quietOf(c.resps, d)
}

func deltaResources(t testing.TB, r *discovery.DeltaDiscoveryResponse) []*anypb.Any {
	t.Helper()
	var out []*anypb.Any
	for _, res := range r.GetResources() {
		if res.GetVersion() == "" || res.GetName() == "" {
			t.Fatalf("delta resource without name or version: %v", res)
		}
		out = append(out, res.GetResource())
	}
	return out
}

// TestDelta: the same over delta ADS; each change sends only the assignments it changed.
func TestDelta(t *testing.T) {
	f := testFleet(t)
	ts := startServer(t, f)
	c := dialDelta(t, ts.addr, "envoy-delta")

	c.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType})
	r := c.next()
	if r.GetTypeUrl() != resource.ClusterType || len(r.GetRemovedResources()) != 0 {
		t.Fatalf("first delta response %v", r)
	}
	if got := clusterNames(t, deltaResources(t, r)); !slices.Equal(got, allSorted) {
		t.Fatalf("clusters %v", got)
	}
	c.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: r.GetNonce()})
	c.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: allNames})
	r = c.next()
	state := edsState{}
	if got := state.apply(t, deltaResources(t, r)); r.GetTypeUrl() != resource.EndpointType || !slices.Equal(got, allSorted) {
		t.Fatalf("EDS delta response %s with %v", r.GetTypeUrl(), got)
	}
	state.check(t, f)
	c.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResponseNonce: r.GetNonce()})

	for _, ch := range fleetChanges(t, f) {
		ch.apply()
		r := c.next()
		if r.GetTypeUrl() != resource.EndpointType || len(r.GetRemovedResources()) != 0 {
			t.Fatalf("%s: got %s (removed %v)", ch.name, r.GetTypeUrl(), r.GetRemovedResources())
		}
		if got := state.apply(t, deltaResources(t, r)); !slices.Equal(got, ch.change) {
			t.Fatalf("%s: assignments %v, want %v", ch.name, got, ch.change)
		}
		state.check(t, f)
		c.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResponseNonce: r.GetNonce()})
	}
	if extra := c.quiet(300 * time.Millisecond); len(extra) != 0 {
		t.Fatalf("%d responses after the last change (first %s)", len(extra), extra[0].GetTypeUrl())
	}
	if st := ts.Stats(); st.Clients != 1 || st.Pushes != 6 || st.Nacks != 0 {
		t.Fatalf("stats %+v", st)
	}
	if cds := metricValue(t, ts.metrics.pushes.WithLabelValues("cds")); cds != 1 {
		t.Fatalf("CDS pushed %v times", cds)
	}
}

// TestReconnect: a client that reconnects, naming the versions it had, gets the current
// state; so does a client that reconnects with no version.
func TestReconnect(t *testing.T) {
	f := testFleet(t)
	ts := startServer(t, f)
	c := dialSotw(t, ts.addr, "envoy-1")
	c.subscribe(resource.ClusterType)
	cds := c.next()
	c.ack(cds)
	c.subscribe(resource.EndpointType, allNames...)
	eds := c.next()
	c.ack(eds, allNames...)
	c.close()
	poll.Until(t, 10*time.Second, "the client to be gone", func() bool { return ts.Stats().Clients == 0 })

	for _, ch := range fleetChanges(t, f) {
		ch.apply()
	}
	poll.Until(t, 10*time.Second, "the last fleet version published", func() bool { return ts.Stats().FleetVersion == f.Version() })
	for _, versions := range [][2]string{{cds.GetVersionInfo(), eds.GetVersionInfo()}, {"", ""}} {
		c := dialSotw(t, ts.addr, "envoy-1")
		c.send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: versions[0]})
		c.send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, VersionInfo: versions[1], ResourceNames: allNames})
		state := edsState{}
		var got []string
		for range 2 {
			r := c.next()
			switch r.GetTypeUrl() {
			case resource.ClusterType:
				got = append(got, "cds "+r.GetVersionInfo()+" "+strings.Join(clusterNames(t, r.GetResources()), ","))
			case resource.EndpointType:
				got = append(got, "eds "+r.GetVersionInfo()+" "+strings.Join(state.apply(t, r.GetResources()), ","))
			}
		}
		slices.Sort(got)
		want := []string{"cds cds-1 " + strings.Join(allSorted, ","), "eds " + ts.Stats().Version + " " + strings.Join(allSorted, ",")}
		if !slices.Equal(got, want) {
			t.Fatalf("reconnect with versions %q: got %q, want %q", versions, got, want)
		}
		state.check(t, f)
		c.close()
	}
}

// follower is a state-of-the-world client that accepts every response at once, in its own
// goroutine, and records the EDS versions it gets (with the assignments when decode is set).
type follower struct {
	conn   *grpc.ClientConn
	cancel context.CancelFunc
	done   chan struct{}
	decode bool
	got    chan<- string // receives every EDS version, when set

	mu      sync.Mutex
	version string
	state   edsState
	cds     int
	err     error
}

func startFollower(t testing.TB, conn *grpc.ClientConn, node string, decode bool, got chan<- string, opts ...grpc.CallOption) *follower {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	fl := &follower{conn: conn, cancel: cancel, done: make(chan struct{}), decode: decode, got: got, state: edsState{}}
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	n := &corev3.Node{Id: node}
	if err := stream.Send(&discovery.DiscoveryRequest{Node: n, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: allNames}); err != nil {
		t.Fatal(err)
	}
	go fl.loop(stream)
	return fl
}

func (fl *follower) loop(stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient) {
	defer close(fl.done)
	for {
		r, err := stream.Recv()
		if err != nil {
			return
		}
		var names []string
		if r.GetTypeUrl() == resource.EndpointType {
			names = allNames
		}
		fl.mu.Lock()
		switch r.GetTypeUrl() {
		case resource.ClusterType:
			fl.cds++
		case resource.EndpointType:
			fl.version = r.GetVersionInfo()
			if fl.decode {
				for _, a := range r.GetResources() {
					cla := &endpointv3.ClusterLoadAssignment{}
					if err := a.UnmarshalTo(cla); err != nil && fl.err == nil {
						fl.err = err
					}
					fl.state[cla.GetClusterName()] = cla
				}
			}
		}
		fl.mu.Unlock()
		if err := stream.Send(&discovery.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), VersionInfo: r.GetVersionInfo(),
			ResponseNonce: r.GetNonce(), ResourceNames: names}); err != nil {
			return
		}
		if fl.got != nil && r.GetTypeUrl() == resource.EndpointType {
			fl.got <- r.GetVersionInfo()
		}
	}
}

func (fl *follower) stop() {
	fl.cancel()
	<-fl.done
}

func (fl *follower) current() (version string, cds int) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return fl.version, fl.cds
}

// TestManyClientsConverge: 100 clients, a burst of 60 changes; every client ends at the last
// version, with the fleet's state, and none got CDS twice.
func TestManyClientsConverge(t *testing.T) {
	f := newTestFleet(t,
		engineSpec{"e1", "10.0.0.1:8000", "prefill", false},
		engineSpec{"e2", "10.0.0.2:8000", "prefill", false},
		engineSpec{"e3", "10.0.0.3:8000", "decode", false},
		engineSpec{"e4", "10.0.0.4:8000", "decode", false},
		engineSpec{"e5", "10.0.0.5:8000", "decode", false},
		engineSpec{"e6", "10.0.0.6:8000", "decode", false},
	)
	ts := startServer(t, f)
	const clients = 100
	var fls []*follower
	for i := range clients {
		conn := dialConn(t, ts.addr)
		fl := startFollower(t, conn, fmt.Sprintf("envoy-%d", i), true, nil)
		fls = append(fls, fl)
		t.Cleanup(func() { fl.stop(); _ = conn.Close() })
	}
	poll.Until(t, 10*time.Second, "100 clients at the first version", func() bool {
		for _, fl := range fls {
			if v, _ := fl.current(); v != "eds-1" {
				return false
			}
		}
		return true
	})
	for i := range 60 {
		id := fmt.Sprintf("e%d", 2+i%5)
		switch i % 3 {
		case 0:
			e, _ := f.Engine(id)
			mustEngine(t)(f.SetPinned(id, false, xdsEpoch, "burst"))
			mustEngine(t)(f.SetRole(id, 3-e.Role, xdsEpoch, "burst"))
		case 1:
			mustEngine(t)(f.Drain(id, xdsEpoch, "burst", fleet.Floors{}))
		case 2:
			e, _ := f.Engine(id)
			mustEngine(t)(f.SetPinned(id, !e.Pinned, xdsEpoch, "burst"))
		}
	}
	poll.Until(t, 10*time.Second, "the last fleet version published", func() bool { return ts.Stats().FleetVersion == f.Version() })
	want := ts.Stats().Version
	poll.Until(t, 10*time.Second, "every client at "+want, func() bool {
		for _, fl := range fls {
			if v, _ := fl.current(); v != want {
				return false
			}
		}
		return true
	})
	for i, fl := range fls {
		fl.mu.Lock()
		cds, err, state := fl.cds, fl.err, maps.Clone(fl.state)
		fl.mu.Unlock()
		if err != nil || cds != 1 {
			t.Fatalf("client %d: %d CDS responses, %v", i, cds, err)
		}
		state.check(t, f)
	}
	if st := ts.Stats(); st.Clients != clients || st.Nacks != 0 {
		t.Fatalf("stats %+v", st)
	}
}

var nackStatus = &rpcstatus.Status{Code: 3, Message: "rejected by the test"}

// TestNackNoStorm: a client that rejects every response gets each version once: one CDS and
// one EDS response, then nothing for 1 s; one EDS response per fleet change, then nothing for
// 1 s. (Without the NACK guard in callbacks the same client got ~14,000 responses in 1 s.)
// NACKs are counted and logged.
func TestNackNoStorm(t *testing.T) {
	f := testFleet(t)
	ts := startServer(t, f)
	c := dialSotw(t, ts.addr, "bad-envoy")
	c.subscribe(resource.ClusterType)
	c.subscribe(resource.EndpointType, allNames...)
	names := map[string][]string{resource.EndpointType: allNames}
	// nackAll rejects the expected responses and whatever follows them for 1 s.
	nackAll := func(expected int) []string {
		var got []string
		for timeout := (<-chan time.Time)(nil); ; {
			if len(got) == expected && timeout == nil {
				timeout = time.After(time.Second)
			}
			select {
			case r := <-c.resps:
				got = append(got, typeLabel(r.GetTypeUrl())+" "+r.GetVersionInfo())
				// A NACK names the last version accepted: none.
				c.send(&discovery.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce(),
					ResourceNames: names[r.GetTypeUrl()], ErrorDetail: nackStatus})
			case <-timeout:
				slices.Sort(got)
				return got
			case <-time.After(5 * time.Second):
				t.Fatalf("%d responses within 5s, want %d", len(got), expected)
			}
		}
	}
	if got := nackAll(2); !slices.Equal(got, []string{"cds cds-1", "eds eds-1"}) {
		t.Fatalf("responses while rejecting everything (then 1s more): %v (%d)", got, len(got))
	}
	mustEngine(t)(f.Drain("e2", xdsEpoch, "admin", fleet.Floors{}))
	if got := nackAll(1); !slices.Equal(got, []string{"eds eds-2"}) {
		t.Fatalf("responses after a change (then 1s more): %v (%d)", got, len(got))
	}
	st := ts.Stats()
	if st.Nacks != 3 || st.Pushes != 3 {
		t.Fatalf("stats %+v", st)
	}
	if cds, eds := metricValue(t, ts.metrics.nacks.WithLabelValues("cds")), metricValue(t, ts.metrics.nacks.WithLabelValues("eds")); cds != 1 || eds != 2 {
		t.Fatalf("narwhal_xds_nacks_total: cds %v eds %v", cds, eds)
	}
	if logs := ts.logs.String(); strings.Count(logs, "client rejected a response") != 3 || !strings.Contains(logs, "version=eds-2") ||
		!strings.Contains(logs, "rejected by the test") || !strings.Contains(logs, "node=bad-envoy") {
		t.Fatalf("logs:\n%s", logs)
	}

	// The same client, once it accepts, is served again.
	mustEngine(t)(f.SetPinned("e2", true, xdsEpoch, "admin"))
	r := c.next()
	if r.GetVersionInfo() != "eds-3" {
		t.Fatalf("after NACKs: %s %s", r.GetTypeUrl(), r.GetVersionInfo())
	}
}

// TestDeltaNackNoStorm: the same over delta.
func TestDeltaNackNoStorm(t *testing.T) {
	f := testFleet(t)
	ts := startServer(t, f)
	c := dialDelta(t, ts.addr, "bad-envoy")
	c.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType})
	c.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: allNames})
	nackAll := func(expected int) []string {
		var got []string
		for timeout := (<-chan time.Time)(nil); ; {
			if len(got) == expected && timeout == nil {
				timeout = time.After(time.Second)
			}
			select {
			case r := <-c.resps:
				got = append(got, fmt.Sprintf("%s %d", typeLabel(r.GetTypeUrl()), len(r.GetResources())))
				c.send(&discovery.DeltaDiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce(), ErrorDetail: nackStatus})
			case <-timeout:
				slices.Sort(got)
				return got
			case <-time.After(5 * time.Second):
				t.Fatalf("%d responses within 5s, want %d", len(got), expected)
			}
		}
	}
	if got := nackAll(2); !slices.Equal(got, []string{"cds 3", "eds 3"}) {
		t.Fatalf("responses while rejecting everything (then 1s more): %v", got)
	}
	mustEngine(t)(f.Drain("e2", xdsEpoch, "admin", fleet.Floors{}))
	if got := nackAll(1); !slices.Equal(got, []string{"eds 2"}) {
		t.Fatalf("responses after a change (then 1s more): %v", got)
	}
	if st := ts.Stats(); st.Nacks != 3 || st.Pushes != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// TestUnservedType: a request for a type Narwhal does not serve (LDS) is left unanswered and
// does not end the stream: CDS and EDS still flow on it.
func TestUnservedType(t *testing.T) {
	f := testFleet(t)
	ts := startServer(t, f)
	c := dialSotw(t, ts.addr, "envoy-lds")
	c.subscribe(resource.ListenerType)
	c.subscribe(resource.ClusterType)
	if r := c.next(); r.GetTypeUrl() != resource.ClusterType {
		t.Fatalf("got %s", r.GetTypeUrl())
	}
	c.subscribe(resource.EndpointType, allNames...)
	if r := c.next(); r.GetTypeUrl() != resource.EndpointType {
		t.Fatalf("got %s", r.GetTypeUrl())
	}
	if extra := c.quiet(100 * time.Millisecond); len(extra) != 0 {
		t.Fatalf("unexpected %s", extra[0].GetTypeUrl())
	}
	if !strings.Contains(ts.logs.String(), "does not serve") {
		t.Fatalf("logs:\n%s", ts.logs.String())
	}
}

// TestContextEndsStreams: when the server's context ends, Run returns and the open ADS streams
// end, so that GracefulStop of the gRPC server returns at once instead of waiting for every
// proxy to hang up.
func TestContextEndsStreams(t *testing.T) {
	f := testFleet(t)
	ctx, cancel := context.WithCancel(context.Background())
	s := NewServer(ctx, "narwhal", f, nil, nil)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(ServerOptions()...)
	s.Register(g)
	served := make(chan struct{})
	go func() { _ = g.Serve(lis); close(served) }()
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()

	c := dialSotw(t, lis.Addr().String(), "envoy-1")
	c.subscribe(resource.ClusterType)
	c.next()
	cancel()
	if err := <-ran; err != context.Canceled {
		t.Fatalf("Run returned %v", err)
	}
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the ADS stream is still open after Run returned")
	}
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		g.Stop()
		t.Fatal("GracefulStop waited for the ADS streams")
	}
	<-served
	if st := s.Stats(); st.Clients != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// Restrict: a node id not on the list gets PERMISSION_DENIED and no resource, on state-of-the-
// world and delta streams alike; the refusal is counted every time and logged once per node. An
// allowed node is served as before. With identities, a plaintext client (no certificate) is
// refused at the stream's opening.
func TestRestrict(t *testing.T) {
	f := testFleet(t)
	ts := startServer(t, f, func(s *Server) { s.Restrict([]string{"envoy-1"}, nil) })
	refused := func(what string, done <-chan struct{}, err *error, resps int) {
		t.Helper()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the stream was not ended", what)
		}
		if status.Code(*err) != codes.PermissionDenied || resps != 0 || !strings.Contains((*err).Error(), "is not in xds.nodes") {
			t.Fatalf("%s: ended with %v after %d responses", what, *err, resps)
		}
	}
	for i := range 2 {
		c := dialSotw(t, ts.addr, "intruder")
		c.subscribe(resource.ClusterType)
		refused(fmt.Sprintf("sotw %d", i), c.done, &c.err, len(c.resps))
	}
	d := dialDelta(t, ts.addr, "intruder")
	d.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType})
	refused("delta", d.done, &d.err, len(d.resps))
	if got := ts.Stats().Refused; got != 3 {
		t.Fatalf("refused %d, want 3", got)
	}
	if n := strings.Count(ts.logs.String(), "stream refused"); n != 1 {
		t.Fatalf("refusals logged %d times, want once:\n%s", n, ts.logs.String())
	}
	ok := dialSotw(t, ts.addr, "envoy-1")
	ok.subscribe(resource.ClusterType)
	if r := ok.next(); len(r.GetResources()) != 3 {
		t.Fatalf("the allowed node got %d clusters", len(r.GetResources()))
	}
	// An allowed stream that names another node later is refused too.
	if err := ok.stream.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: allNames, Node: &corev3.Node{Id: "intruder"}}); err != nil {
		t.Fatal(err)
	}
	<-ok.done
	if status.Code(ok.err) != codes.PermissionDenied || !strings.Contains(ok.err.Error(), "changed its node id on the stream (from envoy-1)") {
		t.Fatalf("a node id changed on the stream: %v", ok.err)
	}

	ids := startServer(t, f, func(s *Server) { s.Restrict(nil, []string{"spiffe://x/envoy"}) })
	c := dialSotw(t, ids.addr, "envoy-1")
	// The stream is refused as it opens: the request may already find it closed (EOF).
	_ = c.stream.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, Node: &corev3.Node{Id: "envoy-1"}})
	<-c.done
	if status.Code(c.err) != codes.PermissionDenied || !strings.Contains(c.err.Error(), "(no client certificate)") {
		t.Fatalf("a client without a certificate: %v", c.err)
	}
}
