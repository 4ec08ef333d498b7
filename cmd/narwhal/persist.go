package main

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/ha"
	"github.com/narwhal-llm/narwhal/state"
)

// loadState restores the fleet from the state file under state.dir, or a replica's store
// (docs/durable-state.md), and returns the state for the router's and the controller's parts
// (nil: none, or reset — the config's roles then start, and the next write replaces it). A
// state that cannot be read, is corrupt or belongs to another fleet stops serve with one line
// naming it.
func loadState(cfg *config.Config, f *fleet.Fleet, reset bool, rep *ha.Replica, log *slog.Logger) (*state.File, error) {
	where := "state file " + cfg.State.StateDir() + "/" + state.FileName
	if rep != nil {
		where = rep.Where()
	}
	if reset {
		log.Info("durable state ignored (--reset-state): starting from the config's roles", "state", where)
		return nil, nil
	}
	var file *state.File
	var err error
	if rep != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		file, err = rep.Load(ctx)
		cancel()
	} else if file, err = state.Load(cfg.State.StateDir()); errors.Is(err, state.ErrNoState) {
		file, err = nil, nil
	}
	if err != nil {
		return nil, err
	}
	if file == nil {
		log.Info("no durable state yet: starting from the config's roles", "state", where)
		return nil, nil
	}
	if err := file.Apply(cfg, f, where, log); err != nil {
		return nil, err
	}
	return file, nil
}
