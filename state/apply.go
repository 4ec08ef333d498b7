package state

import (
	"fmt"
	"log/slog"
	"slices"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

// Apply puts the state's engines back into the fleet f of cfg (fleet.Restore); the router's and
// the controller's parts are Corrections and Controller. where names the state in messages. A
// state of another fleet is an error; engines added to or removed from the config since it
// was written, and engines added at run time whose profile the config no longer has (left
// out: their source may add them again), are said in the log.
func (file *File) Apply(cfg *config.Config, f *fleet.Fleet, where string, log *slog.Logger) error {
	added, removed, err := file.Match(cfg)
	if err != nil {
		return fmt.Errorf("%s: %w; start with --reset-state to begin from this config", where, err)
	}
	engines, err := file.Fleet()
	if err != nil {
		return err
	}
	engines = slices.DeleteFunc(engines, func(e fleet.Engine) bool {
		_, known := cfg.Profiles[e.Profile]
		if e.Source != fleet.SourceConfig && !known {
			log.Warn("engine added at run time names a profile the config no longer has: not restored (its source may add it again)", "engine", e.ID, "profile", e.Profile)
			return true
		}
		return false
	})
	if _, err := f.Restore(engines); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	for _, id := range added {
		log.Info("engine added to the config since the state was written: it starts in its configured role", "engine", id)
	}
	for _, id := range removed {
		log.Info("engine removed from the config since the state was written: its saved state is dropped", "engine", id)
	}
	snap := f.Snapshot()
	p, d := snap.Split()
	log.Info("durable state restored", "state", where, "written", file.Written,
		"prefill", p, "decode", d, "decision_seq", file.Controller.Seq)
	return nil
}
