package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/sim"
)

func runEstimate(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("estimate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	keys := fs.String("keys", "", "how many keys in all: 10M, 250k, 1500000 (required)")
	limit := fs.String("limit", "", "the limit, RATE/PERIOD such as 100/1m (required)")
	burst := fs.Int64("burst", 0, "the bucket family's burst (default: the rate)")
	active := fs.String("active", "100%", "the share of keys active within one window")
	format := fs.String("format", "table", "output format: "+strings.Join(sim.Formats, ", "))
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: sluice estimate --keys N --limit RATE/PERIOD [--active P%] [--burst B]")
		fmt.Fprintln(stderr, "\nSPEC §4's memory table for every algorithm, beside sluice's own bytes per key,")
		fmt.Fprintln(stderr, "measured on a sample and extrapolated.")
		fmt.Fprintln(stderr, "\nExample:\n  sluice estimate --keys 10M --limit 100/1m --active 5%")
		fmt.Fprintln(stderr, "\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return errUsage{err}
	}
	if *keys == "" || *limit == "" || fs.NArg() > 0 {
		fs.Usage()
		return errUsage{errors.New("want --keys and --limit")}
	}
	n, err := sim.ParseCount(*keys)
	if err != nil {
		return err
	}
	l, err := sluice.ParseLimit(*limit)
	if err != nil {
		return err
	}
	l.Burst = *burst
	share, err := strconv.ParseFloat(strings.TrimSuffix(*active, "%"), 64)
	if err != nil || share <= 0 || share > 100 {
		return fmt.Errorf("--active %q: want a share such as 5%%", *active)
	}
	rep, err := sim.Estimate(sim.EstimateSpec{Keys: n, Active: share / 100, Limit: l})
	if err != nil {
		return err
	}
	return rep.Write(stdout, *format)
}
