package controller

import (
	"fmt"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

// Health is the deterministic core of the health monitor: it turns probe results, each with the
// time it was seen, into lifecycle transitions of the fleet (docs/role-control.md section 8):
//
//   - an active engine, or one switching role in place, fails after health.unhealthy_after
//     consecutive failed probes;
//   - a failed engine, or one an operator undrained, becomes recovering after
//     health.healthy_after consecutive successful probes (counted from the undrain);
//   - a recovering engine whose probe succeeds health.recover_s or more after it began
//     recovering is readmitted (active); one failed probe while recovering fails it again;
//     one the data path failed n >= 2 times with no failed probe since the first recovers n
//     times as long, up to 5 minutes (recoverFor), and an engine active 5 minutes starts over;
//   - an engine an operator holds drained keeps draining whatever its probes say;
//   - streaks count from the engine's last lifecycle change, whoever made it: an engine that
//     passive health checking marked failed needs health.healthy_after good probes from then;
//   - an engine failed by someone else (passive health) whose probes then never fail until it
//     is readmitted is readmitted unconfirmed (fleet.SightUnconfirmed); failed so again after
//     that, still with no failed probe, it is readmitted blind (fleet.SightBlind): the probes
//     do not see what the data path sees, and its readmission keeps its role.
//
// It keeps only the consecutive-result streaks and changes nothing: Observe returns the
// transition, and the caller applies it to the fleet (Apply does both, as the monitor does).
// It is not safe for concurrent use.
type Health struct {
	cfg     config.Health
	streaks map[string]*streak
}

type streak struct {
	ok, failed int
	// since and lc are the lifecycle change the streak counts from: when, and to what (a change
	// made by someone else at the very instant of the core's own is still seen).
	since time.Time
	lc    fleet.Lifecycle
	// unseen counts the times the engine was failed by someone other than the probes with no
	// probe failing since the first (kept across the probes' own changes: recovering, then
	// active; forgotten once the engine has stayed active maxBlindRecover).
	unseen int
}

// NewHealth returns the health core.
func NewHealth(cfg config.Health) *Health {
	return &Health{cfg: cfg, streaks: map[string]*streak{}}
}

// Clone returns an independent copy of the health core, its streaks included.
func (h *Health) Clone() *Health {
	c := &Health{cfg: h.cfg, streaks: make(map[string]*streak, len(h.streaks))}
	for id, s := range h.streaks {
		cp := *s
		c.streaks[id] = &cp
	}
	return c
}

// Retain forgets the streaks of the engines that are no longer in the fleet.
func (h *Health) Retain(snap fleet.Snapshot) {
	if len(h.streaks) <= len(snap.Engines) {
		held := 0
		for i := range snap.Engines {
			if _, ok := h.streaks[snap.Engines[i].ID]; ok {
				held++
			}
		}
		if held == len(h.streaks) {
			return // no streak of an engine that left
		}
	}
	ids := snap.IDs()
	for id := range h.streaks {
		if _, ok := ids[id]; !ok {
			delete(h.streaks, id)
		}
	}
}

// Observe takes one probe result of engine e (as the fleet has it now) seen at now, and
// returns the lifecycle it must move to (zero when none). The streak goes on from the change
// when the caller applies it; a change made by anyone else restarts it.
func (h *Health) Observe(now time.Time, e fleet.Engine, ok bool) fleet.Lifecycle {
	s := h.streaks[e.ID]
	if s == nil {
		s = &streak{}
		h.streaks[e.ID] = s
	}
	if !s.since.Equal(e.LifecycleSince) || s.lc != e.Lifecycle {
		unseen := 0
		if e.Lifecycle == fleet.Failed {
			unseen = s.unseen + 1
		}
		*s = streak{since: e.LifecycleSince, lc: e.Lifecycle, unseen: unseen}
	}
	if ok {
		s.ok, s.failed = s.ok+1, 0
	} else {
		s.ok, s.failed, s.unseen = 0, s.failed+1, 0
	}
	if e.Lifecycle == fleet.Active && now.Sub(s.since) >= maxBlindRecover {
		s.unseen = 0 // long enough served without the data path failing it: start over
	}
	if e.Held {
		*s = streak{}
		return 0
	}
	to := h.next(&e, s, now)
	if to != 0 {
		s.since, s.lc = now, to // the change the caller applies at now: the streak goes on
	}
	return to
}

// Apply observes one probe result of engine id and applies the transition to the fleet. It
// returns the transition made (zero when none), or an error when the engine is unknown or the
// fleet refused the change (an operator drained it in between, say).
func Apply(h *Health, f *fleet.Fleet, now time.Time, id string, ok bool) (fleet.Lifecycle, error) {
	e, found := f.Engine(id)
	if !found {
		return 0, fmt.Errorf("%w %q", fleet.ErrUnknownEngine, id)
	}
	to := h.Observe(now, e, ok)
	var err error
	switch to {
	case 0:
		return 0, nil
	case fleet.Active:
		_, err = f.Readmit(id, now, "health", h.streaks[id].sight())
	default:
		_, err = f.SetLifecycle(id, to, now, "health")
	}
	if err != nil {
		return 0, err
	}
	return to, nil
}

// maxBlindRecover caps the recovery time of an engine its probes do not see (recoverFor): Envoy's
// default max_ejection_time.
const maxBlindRecover = 300 * time.Second

// recoverFor is how long the engine must recover before readmission: health.recover_s; for an
// engine the data path failed n >= 2 times with no failed probe since the first, n times
// recover_s (or the probe interval, when longer), up to maxBlindRecover — as Envoy's outlier
// detection lengthens each ejection. An engine its probes do not see is then tried again less
// and less often, each try costing the requests that eject it.
func (h *Health) recoverFor(s *streak) time.Duration {
	d := config.Seconds(h.cfg.RecoverS)
	if s.unseen < 2 {
		return d
	}
	base := max(d, config.Seconds(h.cfg.IntervalS))
	return max(d, min(base*time.Duration(s.unseen), maxBlindRecover))
}

// sight is what the probes are known to see of the engine they readmit (fleet.Sight).
func (s *streak) sight() fleet.Sight {
	return fleet.Sight(min(s.unseen, int(fleet.SightBlind)))
}

// next is the lifecycle the engine moves to after its latest probe, or zero.
func (h *Health) next(e *fleet.Engine, s *streak, now time.Time) fleet.Lifecycle {
	switch e.Lifecycle {
	case fleet.Active, fleet.Switching: // a switching engine that stops answering has failed
		if s.failed >= h.cfg.UnhealthyAfter {
			return fleet.Failed
		}
	case fleet.Draining, fleet.Failed:
		if s.ok >= h.cfg.HealthyAfter {
			return fleet.Recovering
		}
		if e.Lifecycle == fleet.Draining && s.failed >= h.cfg.UnhealthyAfter {
			return fleet.Failed
		}
	case fleet.Recovering:
		if s.failed > 0 {
			return fleet.Failed
		}
		if now.Sub(e.LifecycleSince) >= h.recoverFor(s) {
			return fleet.Active
		}
	}
	return 0
}
