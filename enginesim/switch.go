package enginesim

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// roleSwitch is SGLang's in-place role switch (POST /pd_role_switch, server flag
// --enable-pd-role-switch), as enginesim serves it: refused unless enabled, while the engine is
// not idle (a request in flight anywhere: queued, prefilling, decoding, or pulling its prefill
// from a prefiller) or while a switch is in progress; otherwise the engine rebuilds for
// Options.RoleSwitchS (refusing completions meanwhile, 503 role_switch_in_progress) and answers
// {"success": true, "message", "old_role", "new_role"} — or, with Options.RoleSwitchFail, fails
// the rebuild: it answers success false and marks itself unhealthy (GET /health 503) for good.
type roleSwitch struct {
	mu        sync.Mutex
	role      string
	switching bool
	unhealthy bool
	inflight  atomic.Int64 // completions being served
	// results counts the answers: ok, refused, failed.
	ok, refused, failed atomic.Uint64
}

type switchAnswer struct {
	Success bool   `json:"success"`
	Message string `json:"message"`
	OldRole string `json:"old_role,omitempty"`
	NewRole string `json:"new_role,omitempty"`
}

func (e *Engine) servePDRoleSwitch(w http.ResponseWriter, r *http.Request) {
	s := &e.sw
	refuse := func(status int, msg string) {
		s.refused.Add(1)
		writeJSON(w, status, switchAnswer{Message: msg})
	}
	if !e.opts.RoleSwitch {
		refuse(http.StatusBadRequest, "PD role switch is not enabled (--pd-role-switch)")
		return
	}
	var req struct {
		NewRole string `json:"new_role"`
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err := json.Unmarshal(body, &req); err != nil || (req.NewRole != "prefill" && req.NewRole != "decode") {
		refuse(http.StatusBadRequest, `the body must be {"new_role": "prefill"|"decode"}`)
		return
	}
	s.mu.Lock()
	switch n := s.inflight.Load(); {
	case s.switching:
		s.mu.Unlock()
		refuse(http.StatusBadRequest, "a role switch is in progress")
		return
	case s.unhealthy:
		s.mu.Unlock()
		refuse(http.StatusServiceUnavailable, "the engine is unhealthy")
		return
	case n > 0:
		s.mu.Unlock()
		refuse(http.StatusBadRequest, "the engine is not idle: "+strconv.FormatInt(n, 10)+" requests in flight")
		return
	}
	old := s.role
	s.switching = true
	s.mu.Unlock()
	if !sleepCtx(r.Context(), time.Duration(e.opts.RoleSwitchS*float64(time.Second))) {
		s.mu.Lock()
		s.switching = false
		s.mu.Unlock()
		return
	}
	s.mu.Lock()
	s.switching = false
	if e.opts.RoleSwitchFail {
		s.unhealthy = true
		s.mu.Unlock()
		s.failed.Add(1)
		e.log.Warn("role switch failed (RoleSwitchFail): the engine is unhealthy now", "from", old, "to", req.NewRole)
		writeJSON(w, http.StatusInternalServerError, switchAnswer{Message: "rebuilding the disaggregation runtime failed; the engine is unhealthy", OldRole: old, NewRole: old})
		return
	}
	s.role = req.NewRole
	s.mu.Unlock()
	s.ok.Add(1)
	e.log.Info("role switched", "from", old, "to", req.NewRole)
	writeJSON(w, http.StatusOK, switchAnswer{Success: true, Message: "switched from " + old + " to " + req.NewRole, OldRole: old, NewRole: req.NewRole})
}

// admit counts a completion in flight; it is refused while a switch rebuilds the engine.
func (s *roleSwitch) admit() *apiError {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.switching {
		return &apiError{status: http.StatusServiceUnavailable, message: "the engine is switching its role",
			typ: "server_error", code: "role_switch_in_progress"}
	}
	s.inflight.Add(1)
	return nil
}

func (s *roleSwitch) done() { s.inflight.Add(-1) }

// state is the role /health reports and whether the engine is healthy.
func (s *roleSwitch) state() (role string, healthy bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.role, !s.unhealthy
}
