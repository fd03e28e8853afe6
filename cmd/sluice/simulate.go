package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/sluice-rl/sluice/sim"
)

func runSimulate(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	format := fs.String("format", "table", "output format: "+strings.Join(sim.Formats, ", "))
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: sluice simulate SCENARIO [--format table|json|csv]")
		fmt.Fprintln(stderr, "\nExample:\n  sluice simulate gcra-vs-token-bucket --format json")
		fmt.Fprintln(stderr, "\nScenarios:")
		for _, s := range sim.Scenarios() {
			fmt.Fprintf(stderr, "  %-22s %s\n", s.Name, s.Description)
		}
		fmt.Fprintln(stderr, "\nFlags:")
		fs.PrintDefaults()
	}
	// Accept flags before or after the scenario name.
	var positional []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			if err == flag.ErrHelp {
				return nil
			}
			return errUsage{err}
		}
		args = fs.Args()
		if len(args) > 0 {
			positional = append(positional, args[0])
			args = args[1:]
		}
	}
	if len(positional) != 1 {
		fs.Usage()
		return errUsage{fmt.Errorf("want one scenario, got %d", len(positional))}
	}
	s, err := sim.Lookup(positional[0])
	if err != nil {
		return err
	}
	rep, err := s.Run()
	if err != nil {
		return err
	}
	return rep.Write(stdout, *format)
}
