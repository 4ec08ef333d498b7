package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// RoleSwitcher tells an engine to change role in place (SGLangSwitch does, over HTTP).
type RoleSwitcher interface {
	Switch(ctx context.Context, addr string, to fleet.Role) (string, error)
}

// Residents is the router as the switcher reads it (router.Live implements it): the engines'
// residents, and a wait until they satisfy a condition.
type Residents interface {
	Await(ctx context.Context, cond func(router.Snapshot) bool) error
}

var _ Residents = (*router.Live)(nil)

// Switcher carries out in-place role switches (docs/role-control.md section 11). For each
// engine the fleet has switching it waits until the router shows nothing resident on it (no
// prefill, no decode stream, no stream reserved by a request still prefilling elsewhere), asks
// the engine to switch, once, and ends the switch in the fleet with the engine's answer: the
// new role and active, or failed. An engine that leaves switching before it is asked (an
// operator drain, failed probes) is not asked: its switch is abandoned. Each step is a fleet
// event, and so a decision-log line.
type Switcher struct {
	Fleet   *fleet.Fleet
	Router  Residents
	Client  RoleSwitcher
	Timeout time.Duration // bound on one switch call (controller.switch_timeout_s)
	Logger  *slog.Logger

	mu     sync.Mutex
	active map[string]bool // engines with a switch being carried
}

// Run carries every switch the fleet starts until ctx ends.
func (s *Switcher) Run(ctx context.Context) {
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	s.active = map[string]bool{}
	ch, cancel := s.Fleet.Subscribe()
	defer cancel()
	again := make(chan struct{}, 1) // a carry ended: look again (a next switch of its engine)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		for _, e := range s.Fleet.Snapshot().Engines {
			s.mu.Lock()
			start := e.SwitchTo != 0 && !s.active[e.ID]
			if start {
				s.active[e.ID] = true
			}
			s.mu.Unlock()
			if start {
				wg.Go(func() {
					s.carry(ctx, e.ID)
					s.mu.Lock()
					delete(s.active, e.ID)
					s.mu.Unlock()
					select {
					case again <- struct{}{}:
					default:
					}
				})
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ch:
		case <-again:
		}
	}
}

// carry takes one engine's switch to its end.
func (s *Switcher) carry(ctx context.Context, id string) {
	switching := func() (fleet.Engine, bool) {
		e, ok := s.Fleet.Engine(id)
		return e, ok && e.SwitchTo != 0 && e.Lifecycle == fleet.Switching
	}
	err := s.Router.Await(ctx, func(snap router.Snapshot) bool {
		if _, ok := switching(); !ok {
			return true
		}
		for _, l := range snap.Engines {
			if l.ID == id {
				return l.PrefillResidents+l.DecodeResidents+l.ReservedStreams == 0
			}
		}
		return true
	})
	if err != nil {
		return // shutting down: the durable state keeps the switch, a restart resumes it
	}
	e, ok := switching()
	if !ok {
		if e, _ := s.Fleet.Engine(id); e.SwitchTo != 0 {
			s.finish(id, fleet.SwitchAbandoned, fmt.Sprintf("it became %s before it was asked", e.Lifecycle))
		}
		return
	}
	if _, err := s.Fleet.AskSwitch(id, time.Now(), "its residents finished"); err != nil {
		s.Logger.Warn("switch: not asked", "engine", id, "err", err)
		return
	}
	s.Logger.Info("switch: asking the engine", "engine", id, "to", e.SwitchTo, "addr", e.Addr)
	cctx, cancel := context.WithTimeout(ctx, s.Timeout)
	msg, err := s.Client.Switch(cctx, e.Addr, e.SwitchTo)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return // shutting down
		}
		s.finish(id, fleet.SwitchFailed, err.Error())
		return
	}
	s.finish(id, fleet.SwitchSucceeded, msg)
}

func (s *Switcher) finish(id string, r fleet.SwitchResult, detail string) {
	e, err := s.Fleet.FinishSwitch(id, r, time.Now(), detail)
	if err != nil {
		s.Logger.Warn("switch: could not end", "engine", id, "result", r, "err", err)
		return
	}
	level := slog.LevelInfo
	if r != fleet.SwitchSucceeded {
		level = slog.LevelWarn
	}
	s.Logger.Log(context.Background(), level, "switch: ended", "engine", id, "result", r, "role", e.Role, "lifecycle", e.Lifecycle, "detail", detail)
}

// SGLangSwitch switches SGLang engines (server flag --enable-pd-role-switch): POST
// /pd_role_switch {"new_role": "prefill"|"decode"}, answered {"success", "message",
// "old_role", "new_role"}. A refusal (the engine is not idle, a switch is in progress) or a
// failed rebuild is an error carrying the engine's message.
type SGLangSwitch struct {
	Client *http.Client
}

// Switch asks the engine at addr (host:port) to take role to.
func (c SGLangSwitch) Switch(ctx context.Context, addr string, to fleet.Role) (string, error) {
	body, _ := json.Marshal(map[string]string{"new_role": to.String()})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/pd_role_switch", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	hc := c.Client
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("POST /pd_role_switch: %w", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var ans struct {
		Success *bool  `json:"success"`
		Message string `json:"message"`
		OldRole string `json:"old_role"`
		NewRole string `json:"new_role"`
	}
	if err := json.Unmarshal(raw, &ans); err != nil || ans.Success == nil {
		return "", fmt.Errorf("POST /pd_role_switch answered %s: %s", resp.Status, strings.TrimSpace(string(raw)))
	}
	switch {
	case !*ans.Success:
		return "", fmt.Errorf("POST /pd_role_switch refused (%s): %s", resp.Status, ans.Message)
	case resp.StatusCode/100 != 2:
		return "", fmt.Errorf("POST /pd_role_switch answered %s: %s", resp.Status, ans.Message)
	case ans.NewRole != "" && ans.NewRole != to.String():
		return "", fmt.Errorf("POST /pd_role_switch: the engine says it is now %s, not %s", ans.NewRole, to)
	}
	return fmt.Sprintf("%s -> %s: %s", ans.OldRole, ans.NewRole, ans.Message), nil
}
