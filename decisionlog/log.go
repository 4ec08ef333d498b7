package decisionlog

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

// Log writes the decision log: JSON lines, a Config line and a fleet Snapshot first, then every
// fleet event and decision in the order they happened. It is safe for concurrent use; a nil
// *Log writes nothing.
type Log struct {
	mu    sync.Mutex
	enc   *json.Encoder
	epoch time.Time
	err   error
}

// New starts a decision log on w at epoch, with the config and the fleet as they start.
func New(w io.Writer, epoch time.Time, cfg *config.Config, snap fleet.Snapshot) *Log {
	l := &Log{enc: json.NewEncoder(w), epoch: epoch}
	at := float64(epoch.UnixMicro()) / 1e6
	l.write(&Config{Kind: KindConfig, EpochUnixS: &at, Controller: cfg.Controller, SLO: cfg.SLO})
	l.Snapshot(epoch, snap)
	return l
}

// Snapshot logs the whole fleet at now: the log's start, and again whenever the fleet changed
// without events, as when a replica takes over and restores the state the last leader wrote. A
// reader (narwhal audit) takes the engines from it afresh.
func (l *Log) Snapshot(now time.Time, snap fleet.Snapshot) {
	if l == nil {
		return
	}
	engines := make([]Engine, 0, len(snap.Engines))
	for _, e := range snap.Engines {
		engines = append(engines, Engine{ID: e.ID, Role: e.Role, Lifecycle: e.Lifecycle, Pinned: e.Pinned})
	}
	l.write(&Fleet{Kind: KindFleet, TimeS: l.at(now), Event: Snapshot, Engines: engines})
}

// Fleet logs one fleet event (fleet.Fleet.OnChange). Address changes and restores are left out.
func (l *Log) Fleet(ev fleet.Event) {
	if l == nil || ev.Kind == fleet.EventAddress || ev.Kind == fleet.EventRestored {
		return
	}
	rec := Fleet{Kind: KindFleet, TimeS: l.at(ev.Time), Event: ev.Kind, Engine: ev.Engine, From: ev.From, To: ev.To, Cause: ev.Cause}
	switch ev.Kind {
	case fleet.EventPin:
		rec.Pinned = &ev.Pinned
	case fleet.EventHold:
		rec.Held = &ev.Held
	case fleet.EventSwitch:
		rec.Result = ev.Result
	case fleet.EventAdded:
		rec.Address, rec.Profile = ev.Address, ev.Profile
	case fleet.EventRole:
		rec.Decision = ev.Decision
		if ev.Operator {
			rec.Caller = CallerOperator
		}
	}
	l.write(&rec)
}

// Decision logs one decision record.
func (l *Log) Decision(d *Decision) {
	if l != nil {
		l.write(d)
	}
}

// Err is the first write error, if any.
func (l *Log) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// at is now as the log's time_s.
func (l *Log) at(now time.Time) float64 { return now.Sub(l.epoch).Seconds() }

func (l *Log) write(v any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	if err := l.enc.Encode(v); err != nil {
		l.err = fmt.Errorf("decision log: %w", err)
	}
}
