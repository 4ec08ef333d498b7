// Command narwhal is the Narwhal service: an Envoy ext_proc router and role controller for
// disaggregated LLM prefill/decode fleets. See README.md for the commands.
package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/problem"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

// Exit codes (README): 0 success, 1 runtime failure, 2 bad usage or invalid config.
const (
	exitFailure = 1
	exitUsage   = 2
)

// exitError carries an exit code to main.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usageErr(err error) error   { return &exitError{exitUsage, err} }
func failureErr(err error) error { return &exitError{exitFailure, err} }

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run executes one command line and returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return 0
	}
	var ee *exitError
	if !errors.As(err, &ee) {
		fmt.Fprintf(stderr, "narwhal: %v\n", err) // cobra's own usage errors
		return exitUsage
	}
	var cerrs problem.List
	if errors.As(ee.err, &cerrs) {
		fmt.Fprint(stderr, cerrs.Error(), "\n") // one line per problem, no prefix: path: what
	} else {
		fmt.Fprintf(stderr, "narwhal: %v\n", ee.err)
	}
	return ee.code
}

type globalFlags struct {
	logFormat string
	logLevel  string
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	var g globalFlags
	root := &cobra.Command{
		Use:           "narwhal",
		Short:         "Narwhal routes LLM requests for Envoy and balances prefill/decode roles",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.PersistentFlags().StringVar(&g.logFormat, "log-format", "text", "log format: text or json")
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	root.AddCommand(
		newServe(&g, stderr),
		newValidate(stdout),
		newEnvoyConfig(stdout),
		newEngineSim(&g, stderr),
		newAudit(stdout),
		newSim(stdout, stderr),
		newLoad(stdout, stderr),
		newProfile(stdout, stderr),
		newPreflight(stdout),
		newCerts(stdout),
		&cobra.Command{
			Use:   "version",
			Short: "Print the version",
			Args:  cobra.NoArgs,
			Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "narwhal", version) },
		},
	)
	return root
}

// logger builds the process logger from the global flags.
func (g *globalFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(g.logLevel)); err != nil {
		return nil, usageErr(fmt.Errorf("--log-level: %w", err))
	}
	opts := &slog.HandlerOptions{Level: level}
	switch g.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usageErr(fmt.Errorf("--log-format: want text or json, got %q", g.logFormat))
}

// loadConfig reads --config, or the embedded default when path is empty. An invalid config is a
// usage error (exit 2).
func loadConfig(path string) (*config.Config, error) {
	var (
		cfg *config.Config
		err error
	)
	if path == "" {
		cfg, err = config.LoadDefault()
	} else {
		cfg, err = config.LoadFile(path)
	}
	if err != nil {
		return nil, usageErr(err)
	}
	return cfg, nil
}
