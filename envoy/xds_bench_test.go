//go:build unix

package envoy

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// BenchmarkRoleChange: 1,000 engines, 50 state-of-the-world ADS clients on their own
// connections; one role change per iteration, timed from the fleet change until all 50 clients
// received the new EDS version (all three assignments change). Reports p50-ms and p99-ms of
// that latency, cpu-ms/change (user+sys of the whole process per change: the server, and the
// 50 in-process clients' gRPC receive path; they do not decode the resources, which Envoy would
// do in its own process) and eds-bytes (one response's resources).
func BenchmarkRoleChange(b *testing.B) {
	const engines, clients = 1000, 50
	var specs []engineSpec
	for i := range engines {
		role := "prefill"
		if i%2 == 1 {
			role = "decode"
		}
		specs = append(specs, engineSpec{fmt.Sprintf("e%04d", i), fmt.Sprintf("10.%d.%d.1:8000", i/256, i%256), role, false})
	}
	f := newTestFleet(b, specs...)
	ts := startServer(b, f)
	snap := f.Snapshot()
	size := 0
	for _, cla := range Translate("narwhal", &snap).Assignments {
		size += proto.Size(cla)
	}
	got := make(chan string, clients*4)
	for i := range clients {
		conn := dialConn(b, ts.addr)
		fl := startFollower(b, conn, fmt.Sprintf("envoy-%d", i), false, got, grpc.ForceCodec(headerCodec{}))
		b.Cleanup(func() { fl.stop(); _ = conn.Close() })
	}
	waitAll := func(version string) {
		for n := 0; n < clients; {
			select {
			case v := <-got:
				if v == version {
					n++
				}
			case <-time.After(10 * time.Second):
				b.Fatalf("%d of %d clients got %s within 10s", n, clients, version)
			}
		}
	}
	waitAll("eds-1")

	var lat []time.Duration
	var cpu time.Duration
	seq := 1
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := specs[i%engines].id
		e, _ := f.Engine(id)
		seq++
		want := fmt.Sprintf("eds-%d", seq)
		cpu0 := cpuTime()
		start := time.Now()
		if _, err := f.SetRole(id, 3-e.Role, xdsEpoch, "bench"); err != nil {
			b.Fatal(err)
		}
		waitAll(want)
		lat = append(lat, time.Since(start))
		cpu += cpuTime() - cpu0
	}
	b.StopTimer()
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
	b.ReportMetric(ms(lat[(len(lat)*99)/100]), "p99-ms")
	b.ReportMetric(ms(cpu)/float64(b.N), "cpu-ms/change")
	b.ReportMetric(float64(size), "eds-bytes")
	if st := ts.Stats(); st.Nacks != 0 || st.Version != fmt.Sprintf("eds-%d", seq) || st.Clients != clients {
		b.Fatalf("stats %+v", st)
	}
}

// headerCodec decodes only type_url, version_info and nonce of a DiscoveryResponse (all a
// benchmark client needs to ACK), skipping the resources.
type headerCodec struct{}

func (headerCodec) Name() string { return "proto" }

func (headerCodec) Marshal(v any) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }

func (headerCodec) Unmarshal(data []byte, v any) error {
	r, ok := v.(*discovery.DiscoveryResponse)
	if !ok {
		return proto.Unmarshal(data, v.(proto.Message))
	}
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
		if typ == protowire.BytesType && (num == 1 || num == 4 || num == 5) {
			s, n := protowire.ConsumeString(data)
			if n < 0 {
				return protowire.ParseError(n)
			}
			switch num {
			case 1:
				r.VersionInfo = s
			case 4:
				r.TypeUrl = s
			case 5:
				r.Nonce = s
			}
			data = data[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, data)
		if n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
	}
	return nil
}

// cpuTime is the process's user+sys CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
