package discovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.yaml.in/yaml/v3"

	"github.com/narwhal-llm/narwhal/fleet"
)

// SourceFile is the fleet.Engine.Source of the engines an endpoints file lists.
const SourceFile = "file"

// endpointsFile is llm-d's file-discovery layout.
type endpointsFile struct {
	Endpoints []struct {
		Name    string            `yaml:"name"`
		Address string            `yaml:"address"`
		Port    int               `yaml:"port"`
		Labels  map[string]string `yaml:"labels"`
	} `yaml:"endpoints"`
}

// ParseEndpoints reads an endpoints file: endpoints: [{name, address, port, labels}], the
// address an IP or a host name, with the port in port or in the address (host:port). Unknown
// keys, an entry without a name or an address, and a port out of range are errors naming the
// entry.
func ParseEndpoints(data []byte) ([]Endpoint, error) {
	var f endpointsFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	out := make([]Endpoint, 0, len(f.Endpoints))
	for i, e := range f.Endpoints {
		addr := e.Address
		switch {
		case e.Name == "":
			return nil, fmt.Errorf("endpoints[%d]: no name", i)
		case e.Address == "":
			return nil, fmt.Errorf("endpoints[%d] (%s): no address", i, e.Name)
		case e.Port < 0 || e.Port > 65535:
			return nil, fmt.Errorf("endpoints[%d] (%s): port %d out of range", i, e.Name, e.Port)
		case e.Port > 0:
			addr = net.JoinHostPort(e.Address, strconv.Itoa(e.Port))
		}
		out = append(out, Endpoint{Name: e.Name, Address: addr, Labels: e.Labels})
	}
	return out, nil
}

// FileStatus is what /narwhal/state shows of file discovery.
type FileStatus struct {
	Path string `json:"path"`
	// Read is when the file was last read and reconciled; Engines how many it listed.
	Read    time.Time `json:"read"`
	Engines int       `json:"engines"`
	// Error is why the last read failed (the membership stays what the last good read made
	// it); Problems the listed engines that could not be taken as listed.
	Error    string   `json:"error,omitempty"`
	Problems []string `json:"problems,omitempty"`
}

// File watches an endpoints file and reconciles the fleet with it: at start, on every change
// in the file's directory (so an atomic rename over the file and a ConfigMap's symlink swap are
// seen), and every Resync. A file that cannot be read or parsed changes nothing.
type File struct {
	Path   string
	Resync time.Duration
	Source *Source
	Fleet  *fleet.Fleet
	Now    func() time.Time
	Log    *slog.Logger
	// OnRead, if set, sees the status after every read (metrics, tests); it must be quick.
	OnRead func(FileStatus)

	mu     sync.Mutex
	status FileStatus
}

// Status is the watcher's status now.
func (w *File) Status() FileStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.status
	s.Problems = slices.Clone(s.Problems)
	return s
}

// Run watches until ctx ends. It fails only when the directory cannot be watched at all.
func (w *File) Run(ctx context.Context) error {
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("discovery.file: %w", err)
	}
	defer watcher.Close()
	dir := filepath.Dir(w.Path)
	if err := watcher.Add(dir); err != nil {
		return fmt.Errorf("discovery.file: watch %s: %w", dir, err)
	}
	tick := time.NewTicker(w.Resync)
	defer tick.Stop()
	w.Reconcile()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case _, ok := <-watcher.Events:
			if !ok {
				return nil
			}
			drain(watcher.Events) // a rename or a symlink swap comes as several events
		case err, ok := <-watcher.Errors:
			if !ok {
				return nil
			}
			w.Log.Warn("discovery.file: watch error; the next resync reads the file", "dir", dir, "err", err)
			continue
		}
		w.Reconcile()
	}
}

func drain(ch <-chan fsnotify.Event) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// Reconcile reads the file once and reconciles the fleet with it.
func (w *File) Reconcile() {
	now := w.Now()
	data, err := os.ReadFile(w.Path)
	var eps []Endpoint
	if err == nil {
		eps, err = ParseEndpoints(data)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	defer w.told()
	w.status.Path = w.Path
	if err != nil {
		msg := err.Error()
		if msg != w.status.Error {
			w.Log.Error("discovery.file: the endpoints file is not usable; the fleet keeps its engines", "path", w.Path, "err", err)
		}
		w.status.Error = msg
		return
	}
	res := w.Source.Reconcile(w.Fleet, eps, now)
	if w.status.Error != "" {
		w.Log.Info("discovery.file: the endpoints file is usable again", "path", w.Path)
	}
	if !slices.Equal(res.Problems, w.status.Problems) {
		for _, p := range res.Problems {
			w.Log.Warn("discovery.file: engine not taken as listed", "path", w.Path, "problem", p)
		}
	}
	if res.Changed() {
		w.Log.Info("discovery.file: fleet reconciled", "path", w.Path, "added", res.Added, "removed", res.Removed, "relabelled", res.Moved)
	}
	for _, id := range res.Unprofiled {
		w.Log.Warn("discovery.file: "+UnprofiledLine, "engine", id, "profile", w.Source.cfg.DiscoveredProfile(""), "label", w.Source.cfg.Discovery.ProfileLabel)
	}
	w.status = FileStatus{Path: w.Path, Read: now, Engines: len(eps), Problems: res.Problems}
}

// told passes the status to OnRead; w.mu is held.
func (w *File) told() {
	if w.OnRead != nil {
		s := w.status
		s.Problems = slices.Clone(s.Problems)
		w.OnRead(s)
	}
}
