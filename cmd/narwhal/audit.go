package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/narwhal-llm/narwhal/audit"
	"github.com/narwhal-llm/narwhal/config"
)

func newAudit(stdout io.Writer) *cobra.Command {
	var decisions []string
	var cfgPath string
	cmd := &cobra.Command{
		Use:   "audit --decisions FILE[,FILE...] [--config FILE]",
		Short: "Re-check a decision log (or the logs of several replicas, as one) against the role-control rules; exit 0 when nothing is broken, 1 otherwise",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if len(decisions) == 0 {
				return usageErr(fmt.Errorf("audit: --decisions FILE is required"))
			}
			var ctl *config.Controller
			if cfgPath != "" {
				cfg, err := loadConfig(cfgPath)
				if err != nil {
					return err
				}
				ctl = &cfg.Controller
			}
			logs := make([]audit.Log, 0, len(decisions))
			for _, name := range decisions {
				f, err := os.Open(name)
				if err != nil {
					return failureErr(err)
				}
				defer f.Close()
				logs = append(logs, audit.Log{Name: name, R: f})
			}
			res, err := audit.AuditLogs(logs, ctl)
			if len(logs) == 1 && err != nil {
				err = fmt.Errorf("%s: %w", decisions[0], err)
			}
			if err != nil {
				return failureErr(err)
			}
			for _, v := range res.Violations {
				fmt.Fprintln(stdout, v)
			}
			fmt.Fprintf(stdout, "%d lines, %d decisions, %d role changes (%d by operators), %d violations\n", res.Lines, res.Decisions, res.RoleChanges, res.OperatorMoves, len(res.Violations))
			if len(res.Violations) > 0 {
				return &exitError{exitFailure, fmt.Errorf("audit: %d violations", len(res.Violations))}
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&decisions, "decisions", nil, "the decision log (narwhal serve --decisions); several (comma-separated or repeated) are the logs of one fleet's replicas, audited as one")
	cmd.Flags().StringVar(&cfgPath, "config", "", "check against this config's controller section instead of the log's")
	return cmd
}
