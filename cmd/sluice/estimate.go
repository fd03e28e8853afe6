package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/sim"
	"github.com/sluice-rl/sluice/store/redis"
)

func runEstimate(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("estimate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	keys := fs.String("keys", "", "how many keys in all: 10M, 250k, 1500000 (required)")
	limit := fs.String("limit", "", "the limit, RATE/PERIOD such as 100/1m (required)")
	burst := fs.Int64("burst", 0, "the bucket family's burst (default: the rate)")
	active := fs.String("active", "100%", "the share of keys active within one window")
	format := fs.String("format", "table", "output format: "+strings.Join(sim.Formats, ", "))
	redisURL := fs.String("redis", "", "also measure MEMORY USAGE per key on this Redis (keys are written under a scratch prefix, then deleted)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: sluice estimate --keys N --limit RATE/PERIOD [--active P%] [--burst B] [--redis URL]")
		fmt.Fprintln(stderr, "\nThe back-of-envelope memory table for every algorithm (8 B per timestamp,\n4 B per counter, 64 B of key overhead per key), beside sluice's own bytes per key,")
		fmt.Fprintln(stderr, "measured on a sample and extrapolated.")
		fmt.Fprintln(stderr, "\nExample:\n  sluice estimate --keys 10M --limit 100/1m --active 5%")
		fmt.Fprintln(stderr, "\nFlags:")
		printFlags(stderr, fs)
	}
	positional, help, err := parseArgs(fs, args)
	if help || err != nil {
		return err
	}
	if *keys == "" || *limit == "" || len(positional) > 0 {
		return errUsage{errors.New("want --keys and --limit")}
	}
	// A bad value is the command given wrong: exit status 2.
	n, err := sim.ParseCount(*keys)
	if err != nil {
		return errUsage{fmt.Errorf("--keys: %w", err)}
	}
	l, err := sluice.ParseLimit(*limit)
	if err != nil {
		return errUsage{fmt.Errorf("--limit: %s", strings.TrimPrefix(err.Error(), "sluice: "))}
	}
	l.Burst = *burst
	share, err := strconv.ParseFloat(strings.TrimSuffix(*active, "%"), 64)
	if err != nil || share <= 0 || share > 100 {
		return errUsage{fmt.Errorf("--active %q: want a share such as 5%%", *active)}
	}
	spec := sim.EstimateSpec{Keys: n, Active: share / 100, Limit: l}
	if *redisURL != "" {
		measure, done, err := redisMeasurer(*redisURL)
		if err != nil {
			return err
		}
		defer done()
		spec.Redis = measure
	}
	rep, err := sim.Estimate(spec)
	if err != nil {
		return err
	}
	return rep.Write(stdout, *format)
}

// redisMeasurer writes sample keys with sluice's Redis store, each at its
// limit, and averages their MEMORY USAGE; the keys are deleted afterwards.
// The keys are named as a user's would be (no prefix, the algorithm as the
// rule, a short key), a random tag keeping them apart from real ones.
func redisMeasurer(url string) (func(sluice.Limit) (float64, error), func(), error) {
	s, err := redis.New(redis.Options{URL: url})
	if err != nil {
		return nil, nil, err
	}
	ctx := context.Background()
	tag := rand.Uint32() & 0xffff
	type written struct {
		rule, key string
		l         sluice.Limit
	}
	var keys []written
	measure := func(l sluice.Limit) (float64, error) {
		rule := l.Algorithm.String()
		const sample = 200
		fill := min(l.Capacity(), 1<<16)
		out := make([]sluice.Decision, 1)
		var total int64
		for i := range sample {
			key := fmt.Sprintf("u%04x-%d", tag, i)
			keys = append(keys, written{rule, key, l})
			if err := s.Take(ctx, []sluice.Take{{Rule: rule, Key: key, Limit: l, Cost: fill}}, out); err != nil {
				return 0, err
			}
			n, err := s.MemoryUsage(ctx, rule, key, l)
			if err != nil {
				return 0, err
			}
			total += n
		}
		return float64(total) / sample, nil
	}
	done := func() {
		for _, k := range keys {
			s.Delete(ctx, k.rule, k.key, k.l)
		}
		s.Close()
	}
	return measure, done, nil
}
