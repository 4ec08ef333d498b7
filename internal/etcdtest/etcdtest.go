// Package etcdtest starts a real, single-member etcd server (etcd's own embed package) for
// tests: on ports the system picks, in the test's temporary directory, stopped when the test
// ends.
package etcdtest

import (
	"net/url"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Server is a running etcd.
type Server struct {
	Etcd      *embed.Etcd
	Endpoints []string // its client URLs
	stop      sync.Once
}

// Stop stops the server (etcd unavailable, for a test of that); the test's end stops it too.
func (s *Server) Stop() { s.stop.Do(s.Etcd.Close) }

// Start starts an etcd server for t.
func Start(t testing.TB) *Server {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Dir = t.TempDir()
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	any, _ := url.Parse("http://127.0.0.1:0")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*any}, []url.URL{*any}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*any}, []url.URL{*any}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("etcdtest: start: %v", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Server.Stop()
		t.Fatal("etcdtest: the server did not become ready in 30 s")
	}
	s := &Server{Etcd: e}
	t.Cleanup(s.Stop)
	for _, l := range e.Clients {
		s.Endpoints = append(s.Endpoints, "http://"+l.Addr().String())
	}
	return s
}
