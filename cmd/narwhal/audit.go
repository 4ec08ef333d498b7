package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/narwhal-llm/narwhal/audit"
)

func newAudit(stdout io.Writer) *cobra.Command {
	var decisions, cfgPath string
	cmd := &cobra.Command{
		Use:   "audit --decisions FILE [--config FILE]",
		Short: "Re-check a decision log against the role-control rules; exit 0 when nothing is broken, 1 otherwise",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if decisions == "" {
				return usageErr(fmt.Errorf("audit: --decisions FILE is required"))
			}
			var rules *audit.Rules
			if cfgPath != "" {
				cfg, err := loadConfig(cfgPath)
				if err != nil {
					return err
				}
				c := cfg.Controller
				rules = &audit.Rules{Advisory: c.Advisory, MinPrefill: c.MinPrefill, MinDecode: c.MinDecode}
				rules.Reactive.EvidenceSpanS, rules.Reactive.EvidenceMinArrivals, rules.Reactive.EvidenceMaxSpanS =
					c.Reactive.EvidenceSpanS, c.Reactive.EvidenceMinArrivals, c.Reactive.EvidenceMaxSpanS
				rules.Thresholds.CooldownS, rules.Thresholds.DwellS = c.Thresholds.CooldownS, c.Thresholds.DwellS
			}
			f, err := os.Open(decisions)
			if err != nil {
				return failureErr(err)
			}
			defer f.Close()
			res, err := audit.Audit(f, rules)
			if err != nil {
				return failureErr(fmt.Errorf("%s: %w", decisions, err))
			}
			for _, v := range res.Violations {
				fmt.Fprintln(stdout, v)
			}
			fmt.Fprintf(stdout, "%d lines, %d decisions, %d role changes, %d violations\n", res.Lines, res.Decisions, res.RoleChanges, len(res.Violations))
			if len(res.Violations) > 0 {
				return &exitError{exitFailure, fmt.Errorf("audit: %d violations", len(res.Violations))}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&decisions, "decisions", "", "the decision log (narwhal serve --decisions)")
	cmd.Flags().StringVar(&cfgPath, "config", "", "check against this config's controller section instead of the log's")
	return cmd
}
