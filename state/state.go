// Package state is Narwhal's durable state (docs/durable-state.md): what the fleet, the role
// controller and the router's online correction need to continue exactly where they were after
// a restart — every engine's role, role-since time and whether it ever moved, lifecycle, pin
// and operator hold, the correction factors with their sample counts, the decision sequence,
// the last move toward decode, the confirmation counters and the evidence window.
//
// A single instance keeps it in one file (Save: a temporary file in the same directory,
// written, fsynced, renamed over the old one, and the directory fsynced, so that a crash leaves
// the old file or the new one, never a torn one). The schema is versioned; a file that does not
// parse, has another version, or belongs to another fleet is an error naming the file.
package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/controller"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// Version is the schema version this build writes. It reads it and version 1 (before a switch
// under way kept its decision's number, switch_decision), which it upgrades (upgrade).
const Version = 2

// FileName is the state file's name under state.dir.
const FileName = "narwhal-state.json"

// File is the durable state, as written.
type File struct {
	Version    int                `json:"version"`
	Written    time.Time          `json:"written"`
	Engines    []Engine           `json:"engines"`
	Controller controller.Durable `json:"controller"`
}

// Engine is one engine's durable state.
type Engine struct {
	ID             string    `json:"id"`
	Role           string    `json:"role"`
	RoleSince      time.Time `json:"role_since"`
	Moved          bool      `json:"moved"`
	Lifecycle      string    `json:"lifecycle"`
	LifecycleSince time.Time `json:"lifecycle_since"`
	Pinned         bool      `json:"pinned"`
	Held           bool      `json:"held"`
	// SwitchTo, SwitchCause and SwitchDecision: an in-place role switch under way (lifecycle
	// switching), the role it goes to, who started it (fleet.Mover's cause: "decision N" or
	// "operator (source)") and the decision that did; a restart resumes it.
	SwitchTo       string            `json:"switch_to,omitempty"`
	SwitchCause    string            `json:"switch_cause,omitempty"`
	SwitchDecision uint64            `json:"switch_decision,omitempty"`
	Correction     router.Correction `json:"correction"`
	// An engine that joined at run time (docs/discovery.md) carries its membership: the source
	// that added it, its address, profile and switch method, and whether its role is still the
	// controller's to give. Config engines leave these out (source "" is config).
	Source   string `json:"source,omitempty"`
	Address  string `json:"address,omitempty"`
	Profile  string `json:"profile,omitempty"`
	InPlace  bool   `json:"in_place,omitempty"`
	RoleOpen bool   `json:"role_open,omitempty"`
}

// Capture builds the state of a fleet snapshot, the controller's durable part and the router's
// engine loads (their corrections), at now.
func Capture(snap fleet.Snapshot, c controller.Durable, loads []router.EngineLoad, now time.Time) *File {
	corr := make(map[string]router.Correction, len(loads))
	for _, l := range loads {
		corr[l.ID] = l.Correction
	}
	f := &File{Version: Version, Written: now.UTC(), Controller: c}
	for _, e := range snap.Engines {
		se := Engine{
			ID: e.ID, Role: e.Role.String(), RoleSince: e.RoleSince.UTC(), Moved: e.Moved,
			Lifecycle: e.Lifecycle.String(), LifecycleSince: e.LifecycleSince.UTC(),
			Pinned: e.Pinned, Held: e.Held, SwitchDecision: e.SwitchBy.Decision, Correction: corr[e.ID],
		}
		if e.SwitchTo != 0 {
			se.SwitchTo, se.SwitchCause = e.SwitchTo.String(), e.SwitchBy.Cause()
		}
		if e.Source != fleet.SourceConfig && e.Source != "" {
			se.Source, se.Address, se.Profile, se.InPlace, se.RoleOpen = e.Source, e.Address, e.Profile, e.InPlace, e.RoleOpen
		}
		f.Engines = append(f.Engines, se)
	}
	return f
}

// Fleet returns the engines to restore (fleet.Fleet.Restore).
func (f *File) Fleet() ([]fleet.Engine, error) {
	out := make([]fleet.Engine, 0, len(f.Engines))
	for i, e := range f.Engines {
		role, err := fleet.ParseRole(e.Role)
		if err != nil {
			return nil, fmt.Errorf("engines[%d] (%s): %w", i, e.ID, err)
		}
		lc, err := fleet.ParseLifecycle(e.Lifecycle)
		if err != nil {
			return nil, fmt.Errorf("engines[%d] (%s): %w", i, e.ID, err)
		}
		var to fleet.Role
		if e.SwitchTo != "" {
			if to, err = fleet.ParseRole(e.SwitchTo); err != nil {
				return nil, fmt.Errorf("engines[%d] (%s): switch_to: %w", i, e.ID, err)
			}
		}
		source := e.Source
		if source == "" {
			source = fleet.SourceConfig
		} else if e.Address == "" || e.Profile == "" {
			return nil, fmt.Errorf("engines[%d] (%s): added by %s without an address or a profile", i, e.ID, source)
		}
		out = append(out, fleet.Engine{ID: e.ID, Role: role, RoleSince: e.RoleSince, Moved: e.Moved,
			Lifecycle: lc, LifecycleSince: e.LifecycleSince, Pinned: e.Pinned, Held: e.Held, SwitchTo: to, SwitchBy: switchedBy(e.SwitchDecision, e.SwitchCause),
			Source: source, Address: e.Address, Profile: e.Profile, InPlace: e.InPlace, RoleOpen: e.RoleOpen})
	}
	return out, nil
}

// Corrections returns the saved corrections by engine id (router.Router.RestoreCorrections).
func (f *File) Corrections() map[string]router.Correction {
	out := make(map[string]router.Correction, len(f.Engines))
	for _, e := range f.Engines {
		out[e.ID] = e.Correction
	}
	return out
}

// Match compares the saved engines with the config's: the engines added to the config since
// (not in the file) and those removed from it (in the file only). A file that shares no engine
// with a config that has some belongs to another fleet: an error.
func (f *File) Match(cfg *config.Config) (added, removed []string, err error) {
	saved := map[string]bool{}
	for _, e := range f.Engines {
		if e.Source == "" { // engines added at run time are not the config's
			saved[e.ID] = true
		}
	}
	shared := 0
	configured := map[string]bool{}
	for _, e := range cfg.Engines {
		configured[e.ID] = true
		if saved[e.ID] {
			shared++
		} else {
			added = append(added, e.ID)
		}
	}
	for _, e := range f.Engines {
		if !configured[e.ID] && e.Source == "" {
			removed = append(removed, e.ID)
		}
	}
	if shared == 0 && len(cfg.Engines) > 0 && len(saved) > 0 {
		return nil, nil, fmt.Errorf("it belongs to another fleet: none of its engines (%s) is in the config", join(removed))
	}
	return added, removed, nil
}

// join lists ids for a message, the first five of them.
func join(ids []string) string {
	if len(ids) > 5 {
		return strings.Join(ids[:5], ", ") + fmt.Sprintf(" and %d more", len(ids)-5)
	}
	return strings.Join(ids, ", ")
}

// ErrNoState is Load's error for a directory without a state file (the first start).
var ErrNoState = errors.New("no state file")

// Load reads the state file under dir. A missing file is ErrNoState; a file that is not a
// state file of this version is an error naming it.
func Load(dir string) (*File, error) {
	path := filepath.Join(dir, FileName)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNoState
	}
	if err != nil {
		return nil, fmt.Errorf("state file %s: %w", path, err)
	}
	return Decode(data, "state file "+path)
}

// Decode reads a state document (a file's content, or etcd's <prefix>/state); name says where
// it came from in errors.
func Decode(data []byte, name string) (*File, error) {
	var f File
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%s: not a Narwhal state (%v); move it away, or start with --reset-state", name, err)
	}
	if f.Version == 1 {
		upgrade(&f)
	}
	if f.Version != Version {
		return nil, fmt.Errorf("%s: schema version %d, this build reads 1 and %d; start with --reset-state to begin from the config", name, f.Version, Version)
	}
	if _, err := f.Fleet(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &f, nil
}

// upgrade makes a version-1 state version 2: the decision of a switch under way, which version 1
// kept only in its cause's text ("decision N", the form fleet.DecisionCause writes), becomes
// switch_decision, so that the role event ending the switch names it.
func upgrade(f *File) {
	for i := range f.Engines {
		e := &f.Engines[i]
		if n, ok := strings.CutPrefix(e.SwitchCause, "decision "); ok && e.SwitchDecision == 0 {
			e.SwitchDecision, _ = strconv.ParseUint(n, 10, 64)
		}
	}
	f.Version = Version
}

// switchedBy is who started a saved switch: its decision, else the operator its cause names
// ("operator (source)", as fleet.Mover writes it) — read from the durable text in this one place,
// so that a state any schema-2 build wrote reads the same in every schema-2 build.
func switchedBy(decision uint64, cause string) fleet.Mover {
	if src, ok := strings.CutPrefix(cause, "operator ("); ok && decision == 0 {
		return fleet.Mover{Operator: strings.TrimSuffix(src, ")")}
	}
	return fleet.Mover{Decision: decision}
}

// Encode writes f as a state document.
func Encode(f *File) ([]byte, error) {
	data, err := json.MarshalIndent(f, "", "  ")
	return append(data, '\n'), err
}

// Save writes f as the state file under dir, atomically and durably.
func Save(dir string, f *File) error {
	data, err := Encode(f)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("state dir %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, FileName+".*")
	if err != nil {
		return fmt.Errorf("state dir %s: %w", dir, err)
	}
	defer os.Remove(tmp.Name()) // after the rename, nothing is left to remove
	if _, err = tmp.Write(data); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, FileName))
	}
	if err != nil {
		return fmt.Errorf("state file %s: %w", filepath.Join(dir, FileName), err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync() // the rename itself
}
