// Package discovery turns what a source lists — a watched endpoints file, Kubernetes pods, the
// admin API — into fleet additions, removals and operator role changes (docs/discovery.md).
//
// The core, Source.Reconcile, takes the source's whole current list and the time, and changes
// only the engines that source added: an engine listed and not in the fleet joins, one no longer
// listed leaves, one listed at another address leaves and joins again, and a role label changed
// since the source last listed it is an operator's move. It reads no clock and does no I/O; the
// watchers (file.go) call it with each new list.
package discovery

import (
	"fmt"
	"strings"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

// Endpoint is one engine as a source lists it.
type Endpoint struct {
	Name    string            // the engine's id in the fleet
	Address string            // host:port
	Labels  map[string]string // the role and profile labels (config.Discovery)
	// Annotations may name the profile instead of a label (a pod's annotations).
	Annotations map[string]string
}

// Source reconciles the fleet's engines of one source with the source's list. It is not safe
// for concurrent use: one watcher drives it.
type Source struct {
	name string
	cfg  *config.Config
	// labels is the role label each engine of the source had when last listed: a change of
	// it, and only a change, is an operator's move.
	labels map[string]string
}

// NewSource returns the reconciler of source name ("file", "kubernetes": the engines'
// fleet.Engine.Source).
func NewSource(name string, cfg *config.Config) *Source {
	return &Source{name: name, cfg: cfg, labels: map[string]string{}}
}

// Result is what one reconciliation changed, and what it could not do.
type Result struct {
	Added, Removed, Moved []string
	// Unprofiled are the added engines no profile label or annotation named: they took
	// discovery.default_profile (or the config's only profile).
	Unprofiled []string
	// Problems are the listed engines it could not take as listed (a profile that does not
	// exist, a name or an address another engine has, a role label it does not know), one
	// message each; the rest of the list is reconciled all the same.
	Problems []string
}

// UnprofiledLine is the one log line an engine that joined without a profile label gets.
const UnprofiledLine = "engine joined without a profile label: placed with the default profile; label it with its measured profile (narwhal profile, docs/profiling.md)"

// Changed reports whether the fleet changed.
func (r *Result) Changed() bool { return len(r.Added)+len(r.Removed)+len(r.Moved) > 0 }

func (r *Result) problem(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

// Reconcile makes the source's engines in f what eps lists, at now.
func (s *Source) Reconcile(f *fleet.Fleet, eps []Endpoint, now time.Time) Result {
	var res Result
	snap := f.Snapshot()
	listed := make(map[string]int, len(eps))
	for i, ep := range eps {
		if _, managed := s.role(ep); !managed {
			// llm-d's encode roles, or a role Narwhal does not know: not an engine it places.
			res.problem("%s: label %s=%q: not a role Narwhal places (prefill, decode, or %s/%s/none for the controller to decide); not an engine",
				ep.Name, s.cfg.Discovery.RoleLabel, ep.Labels[s.cfg.Discovery.RoleLabel], config.RolePrefillDecode, config.RoleBoth)
			continue
		}
		if j, dup := listed[ep.Name]; dup {
			res.problem("%s: listed twice (entries %d and %d): the first is taken", ep.Name, j, i)
			continue
		}
		listed[ep.Name] = i
	}
	// Leavers first, so that an address that moves from one name to another is free again.
	for _, e := range snap.Engines {
		if e.Source != s.name {
			continue
		}
		if i, ok := listed[e.ID]; ok && eps[i].Address == e.Address {
			continue
		}
		if _, err := f.Remove(e.ID, now, s.name); err == nil {
			res.Removed = append(res.Removed, e.ID)
			delete(s.labels, e.ID)
		}
	}
	for i, ep := range eps {
		if listed[ep.Name] != i {
			continue
		}
		role, _ := s.role(ep)
		cur, in := f.Engine(ep.Name)
		switch {
		case in && cur.Source != s.name:
			res.problem("%s: the fleet has an engine of that name from %s", ep.Name, cur.Source)
		case in:
			if moved, err := s.operatorMove(f, cur, role, now); err != nil {
				res.problem("%s: label %s=%s: %v", ep.Name, s.cfg.Discovery.RoleLabel, role, err)
			} else if moved {
				res.Moved = append(res.Moved, ep.Name)
			}
		default:
			ce, err := s.Member(ep)
			if err != nil {
				res.problem("%s: %v", ep.Name, err)
				continue
			}
			if _, err := f.Add(ce, s.name, now); err != nil {
				res.problem("%s: %v", ep.Name, err)
				continue
			}
			res.Added = append(res.Added, ep.Name)
			if ep.Labels[s.cfg.Discovery.ProfileLabel] == "" && ep.Annotations[s.cfg.Discovery.ProfileLabel] == "" {
				res.Unprofiled = append(res.Unprofiled, ep.Name)
			}
		}
		s.labels[ep.Name] = role
	}
	return res
}

// Member is the engine an endpoint describes, checked as a config engine is (config.CheckMember):
// its role from the role label ("" when the controller decides), its profile from the profile
// label (or an annotation of that name), else the default, the roles it can play from the
// narwhal.dev/roles label or annotation (none: both), the switch method of discovery.switch.
func (s *Source) Member(ep Endpoint) (config.Engine, error) {
	role, _ := s.role(ep)
	profile := ep.Labels[s.cfg.Discovery.ProfileLabel]
	if profile == "" {
		profile = ep.Annotations[s.cfg.Discovery.ProfileLabel]
	}
	ce := config.Engine{ID: ep.Name, Address: ep.Address, Role: role, Switch: s.cfg.Discovery.Switch,
		Profile: s.cfg.DiscoveredProfile(profile)}
	roles := ep.Labels[config.LabelRoles]
	if roles == "" {
		roles = ep.Annotations[config.LabelRoles]
	}
	for _, r := range strings.Split(roles, ",") {
		if r = strings.TrimSpace(r); r != "" {
			ce.Roles = append(ce.Roles, r)
		}
	}
	return ce, s.cfg.CheckMember(ce)
}

// role reads an endpoint's role label: prefill, decode, or "" for the controller to decide
// (prefill-decode, llm-d's deprecated both, or none); managed is false for a role Narwhal does
// not place (llm-d's encode, encode-prefill, encode-prefill-decode, or one it does not know).
func (s *Source) role(ep Endpoint) (role string, managed bool) {
	switch v := ep.Labels[s.cfg.Discovery.RoleLabel]; v {
	case config.RolePrefill, config.RoleDecode:
		return v, true
	case config.RolePrefillDecode, config.RoleBoth, "":
		return "", true
	}
	return "", false
}

// OpenLabel reports whether a role label value leaves the role to the controller and says the
// engine can play both (prefill-decode, both): Narwhal does not overwrite it with one role.
func OpenLabel(v string) bool { return v == config.RolePrefillDecode || v == config.RoleBoth }

// operatorMove applies a role label changed since the source last listed the engine, when the
// engine is not in that role already (Narwhal's own move, written back, is no change): the
// engine takes it (in place: its switch starts) and dwell holds it there.
func (s *Source) operatorMove(f *fleet.Fleet, e fleet.Engine, label string, now time.Time) (bool, error) {
	last, seen := s.labels[e.ID]
	if !seen || label == last || label == "" || label == e.Role.String() {
		return false, nil
	}
	to, err := fleet.ParseRole(label)
	if err != nil {
		return false, err
	}
	_, err = f.Relabel(e.ID, to, now, s.name)
	return err == nil, err
}
