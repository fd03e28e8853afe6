package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sim"
)

func runSimulate(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	format := fs.String("format", "table", "output format: "+strings.Join(sim.Formats, ", "))
	file := fs.String("file", "", "custom: a scenario file (YAML: seed, duration, background, bursts, limits, rules)")
	seed := fs.Uint("seed", 1, "custom: the traffic's random seed")
	duration := fs.String("duration", "10s", "custom: how long to simulate")
	background := fs.Float64("background", 0, "custom: background requests per second (Poisson)")
	rulesFile := fs.String("rules", "", "custom: a rule file; every request goes through its rules as one client")
	var bursts burstFlags
	var limits limitFlags
	fs.Var(&bursts, "burst", "custom: a burst AT:SIZE:SPREAD, such as 2s:35:200ms (repeatable)")
	fs.Var(&limits, "limit", "custom: a limit ALGORITHM:RATE/PERIOD[:BURST], such as token-bucket:10/1s:20 (repeatable)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: sluice simulate SCENARIO [--format "+strings.Join(sim.Formats, "|")+"]")
		fmt.Fprintln(stderr, "       sluice simulate custom [--file FILE | --background N --burst AT:SIZE:SPREAD --limit ALG:RATE/PERIOD[:BURST]... | --rules FILE]")
		fmt.Fprintln(stderr, "\nExamples:\n  sluice simulate gcra-vs-token-bucket --format json")
		fmt.Fprintln(stderr, "  sluice simulate custom --seed 7 --background 6 --burst 2s:35:200ms --limit token-bucket:10/1s:20 --limit leaky-queue:10/1s:20")
		fmt.Fprintln(stderr, "\nScenarios:")
		for _, s := range sim.Scenarios() {
			fmt.Fprintf(stderr, "  %-22s %s\n", s.Name, s.Description)
		}
		fmt.Fprintf(stderr, "  %-22s %s\n", "custom", "your own traffic and limits (or rules), from flags or a file")
		fmt.Fprintln(stderr, "\nFlags:")
		printFlags(stderr, fs)
	}
	positional, help, err := parseArgs(fs, args)
	if help || err != nil {
		return err
	}
	if len(positional) != 1 {
		names := []string{}
		for _, s := range sim.Scenarios() {
			names = append(names, s.Name)
		}
		return errUsage{fmt.Errorf("want one scenario (%s, custom), got %d", strings.Join(names, ", "), len(positional))}
	}
	if !slices.Contains(sim.Formats, *format) {
		return errUsage{fmt.Errorf("--format %q: want one of %s", *format, strings.Join(sim.Formats, ", "))}
	}
	var rep *sim.Report
	if positional[0] == "custom" {
		spec := &sim.CustomSpec{Seed: uint32(*seed), Background: *background, Bursts: bursts, Limits: limits}
		var err error
		if *file != "" {
			if spec, err = sim.LoadCustom(*file); err != nil {
				return err
			}
		}
		if spec.Duration == 0 {
			if spec.Duration, err = sim.ParseDuration(*duration, 10*time.Second); err != nil {
				return err
			}
		}
		if *rulesFile != "" {
			if spec.Rules, err = rules.Load(*rulesFile); err != nil {
				return err
			}
		}
		if rep, err = sim.Custom(spec); err != nil {
			return err
		}
	} else {
		s, err := sim.Lookup(positional[0])
		if err != nil {
			return errUsage{err}
		}
		if rep, err = s.Run(); err != nil {
			return err
		}
	}
	return rep.Write(stdout, *format)
}

// burstFlags collects --burst AT:SIZE:SPREAD.
type burstFlags []sim.Burst

func (b *burstFlags) String() string { return fmt.Sprint(*b) }

func (b *burstFlags) Set(s string) error {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return fmt.Errorf("want AT:SIZE:SPREAD, such as 2s:35:200ms")
	}
	at, err := sim.ParseDuration(parts[0], 0)
	if err != nil {
		return err
	}
	size, err := strconv.Atoi(parts[1])
	if err != nil || size <= 0 || size > 10_000_000 {
		return fmt.Errorf("burst size %q: want a positive integer", parts[1])
	}
	spread, err := sim.ParseDuration(parts[2], 0)
	if err != nil {
		return err
	}
	*b = append(*b, sim.Burst{At: at, Size: size, Spread: spread})
	return nil
}

// limitFlags collects --limit ALGORITHM:RATE/PERIOD[:BURST].
type limitFlags []sluice.Limit

func (l *limitFlags) String() string { return fmt.Sprint(*l) }

func (l *limitFlags) Set(s string) error {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return fmt.Errorf("want ALGORITHM:RATE/PERIOD[:BURST], such as gcra:10/1s:20")
	}
	a, err := sluice.ParseAlgorithm(parts[0])
	if err != nil {
		return err
	}
	lim, err := sluice.ParseLimit(parts[1])
	if err != nil {
		return err
	}
	lim.Algorithm = a
	if len(parts) == 3 {
		if lim.Burst, err = strconv.ParseInt(parts[2], 10, 64); err != nil {
			return fmt.Errorf("burst %q: %v", parts[2], err)
		}
	}
	if err := lim.Validate(); err != nil {
		return err
	}
	*l = append(*l, lim)
	return nil
}
