package extproc

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/internal/poll"
)

// The stream limit follows the fleet: an engine that joins raises it by its max_streams, one
// that leaves lowers it (FollowFleet, which serve runs).
func TestFollowFleetKeepsTheStreamLimit(t *testing.T) {
	cfg := config.Default()
	f, err := fleet.New(cfg, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(Options{Router: cfg.Router, StreamLimit: StreamLimit(cfg, f.Snapshot().Engines)})
	before := s.limit.Load()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { s.FollowFleet(ctx, cfg, f) })
	defer func() { cancel(); wg.Wait() }()
	more := int64(cfg.Profiles[config.DefaultProfileName].Decode.MaxStreams)
	if _, err := f.Add(config.Engine{ID: "e9", Address: "10.0.0.9:8000", Role: "decode", Profile: config.DefaultProfileName}, "test", time.Now()); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the limit raised by the engine that joined", func() bool { return s.limit.Load() == before+more })
	if _, err := f.Remove("e9", time.Now(), "test"); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the limit back", func() bool { return s.limit.Load() == before })
}
