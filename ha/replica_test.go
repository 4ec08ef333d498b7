package ha

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/controller"
	"github.com/narwhal-llm/narwhal/state"
)

// savedNode is a Member that records the states written.
type savedNode struct {
	Member
	saved [][]byte
}

func (n *savedNode) Save(_ context.Context, data []byte) (int64, error) {
	n.saved = append(n.saved, data)
	return int64(len(n.saved)), nil
}

// The state writer and a decision's Persist write concurrently: a state captured before the last
// one written is not written after it (it would take the decision's number back, and a successor
// would number a decision again).
func TestReplicaSaveKeepsTheNewestState(t *testing.T) {
	n := &savedNode{}
	r := NewReplica(n, "r1", "test", "test", slog.New(slog.DiscardHandler))
	t0 := time.Now()
	older := &state.File{Version: state.Version, Written: t0, Controller: controller.Durable{Seq: 1}}
	newer := &state.File{Version: state.Version, Written: t0.Add(time.Millisecond), Controller: controller.Durable{Seq: 2}}
	if err := r.Save(newer); err != nil {
		t.Fatal(err)
	}
	if err := r.Save(older); err != nil {
		t.Fatal(err)
	}
	if len(n.saved) != 1 {
		t.Fatalf("%d states written, want the newer one only", len(n.saved))
	}
	if err := r.Save(&state.File{Version: state.Version, Written: t0.Add(time.Second), Controller: controller.Durable{Seq: 3}}); err != nil || len(n.saved) != 2 {
		t.Fatalf("a later state: %v, %d written", err, len(n.saved))
	}
}
