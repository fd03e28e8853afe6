package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/schollz/progressbar/v3"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sim"
	"golang.org/x/term"
)

func runReplay(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "", "the rule file to replay through (required)")
	format := fs.String("format", "table", "output format: "+strings.Join(sim.Formats, ", "))
	top := fs.Int("top", 5, "keys to list per rule")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: sluice replay --config RULES ACCESS_LOG [--format table|json|csv]")
		fmt.Fprintln(stderr, "\nReplays an access log (nginx/Apache combined format, or JSON lines) in")
		fmt.Fprintln(stderr, "timestamp order through the rules, on the embedded store and a simulated")
		fmt.Fprintln(stderr, "clock, and reports what each rule would have rejected, and for whom.")
		fmt.Fprintln(stderr, "\nExample:\n  sluice replay --config examples/shop.yaml examples/access.log")
		fmt.Fprintln(stderr, "\nFlags:")
		printFlags(stderr, fs)
	}
	positional, help, err := parseArgs(fs, args)
	if help || err != nil {
		return err
	}
	if *config == "" || len(positional) != 1 {
		return errUsage{errors.New("want --config RULES and one access log")}
	}
	cfg, err := rules.Load(*config)
	if err != nil {
		return err
	}
	f, err := os.Open(positional[0])
	if err != nil {
		return err
	}
	defer f.Close()
	opts := sim.ReplayOptions{TopKeys: *top}
	if info, err := f.Stat(); err == nil && info.Mode().IsRegular() && isTerminal(stderr) {
		bar := progressbar.DefaultBytes(info.Size(), "replaying")
		defer bar.Finish()
		opts.Progress = func(n int64) { bar.Set64(n) }
	}
	res, err := sim.Replay(f, cfg, opts)
	if err != nil {
		return err
	}
	return res.Report().Write(stdout, *format)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
