package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/discovery"
	"github.com/narwhal-llm/narwhal/preflight"
)

func newPreflight(stdout io.Writer) *cobra.Command {
	var cfgPath, envoyFile string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "preflight [--config FILE] [--envoy FILE] [--json]",
		Short: "Check a fleet before it serves: every engine reachable, healthy, serving, as fast as its profile; every P/D pair; each listener's certificate; the Envoy bootstrap's fit",
		Long: "Checks every engine of the config (the embedded default without --config): reachable, its health\n" +
			"path, the model it serves (the same as the other engines of its profile), a one-token completion,\n" +
			"its prefill and decode speed against its profile (a failure beyond ±25%); then a disaggregated\n" +
			"request through every prefill/decode pair placement can make; each TLS listener's certificate\n" +
			"(loads, valid for 7 days more); and with --envoy, the bootstrap's\n" +
			"fit (as validate --envoy). A table, one row a check (--json: the rows as JSON); exit 0 when\n" +
			"every check passes, 1 otherwise. docs/preflight.md.",
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			cfg, err := loadConfig(cfgPath)
			if err != nil {
				return err
			}
			if cfg.Discovery.File.Path != "" { // the engines the endpoints file lists now
				if cfg, err = withFileEngines(cfg, stdout); err != nil {
					return failureErr(err)
				}
			}
			o := preflight.Options{Config: cfg}
			if envoyFile != "" {
				if o.Envoy, err = os.ReadFile(envoyFile); err != nil {
					return usageErr(fmt.Errorf("--envoy: %w", err))
				}
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			checks := preflight.Run(ctx, o)
			failed := 0
			for _, c := range checks {
				if !c.OK {
					failed++
				}
			}
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(checks); err != nil {
					return failureErr(err)
				}
			} else {
				tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "CHECK\tENGINE\tRESULT\tDETAIL")
				for _, c := range checks {
					res := "ok"
					if !c.OK {
						res = "FAIL"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.Check, c.Engine, res, c.Detail)
				}
				_ = tw.Flush()
				fmt.Fprintf(stdout, "%d checks, %d failed\n", len(checks), failed)
			}
			if failed > 0 {
				return &exitError{exitFailure, fmt.Errorf("preflight: %d of %d checks failed", failed, len(checks))}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&cfgPath, "config", "", "Narwhal config file (YAML); the embedded default without it")
	cmd.Flags().StringVar(&envoyFile, "envoy", "", "an Envoy bootstrap (YAML) to check against the config")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the checks as JSON")
	return cmd
}

// withFileEngines returns cfg with the engines discovery.file lists now added to its engines (an
// engine without a role is checked as decode); an engine the file lists that cannot be taken is
// printed and left out.
func withFileEngines(cfg *config.Config, stdout io.Writer) (*config.Config, error) {
	data, err := os.ReadFile(cfg.Discovery.File.Path)
	if err != nil {
		return nil, fmt.Errorf("discovery.file: %w", err)
	}
	eps, err := discovery.ParseEndpoints(data)
	if err != nil {
		return nil, fmt.Errorf("discovery.file %s: %w", cfg.Discovery.File.Path, err)
	}
	out := *cfg
	out.Engines = slices.Clone(cfg.Engines)
	src := discovery.NewSource(discovery.SourceFile, cfg)
	for _, ep := range eps {
		e, err := src.Member(ep)
		if err != nil {
			fmt.Fprintf(stdout, "discovery.file: %s left out: %v\n", ep.Name, err)
			continue
		}
		if e.Role == "" {
			e.Role = config.RoleDecode
		}
		out.Engines = append(out.Engines, e)
	}
	return &out, nil
}
