package main

import (
	"bufio"
	"compress/gzip"
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
	var configs stringList
	fs.Var(&configs, "config", "a rule `FILE` to replay through (required; repeatable: their rules apply together, as serve's)")
	format := fs.String("format", "table", "output format: "+strings.Join(sim.Formats, ", "))
	top := fs.Int("top", 5, "keys to list per rule")
	htmlOut := fs.String("html", "", "also write the report as one self-contained HTML `FILE` (the per-minute chart, the rules, the top keys)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: sluice replay --config RULES [--config RULES...] ACCESS_LOG [--format "+strings.Join(sim.Formats, "|")+"]")
		fmt.Fprintln(stderr, "       (ACCESS_LOG: a file, gzipped or not, or - for standard input)")
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
	if len(configs) == 0 || len(positional) != 1 {
		return errUsage{errors.New("want --config RULES and one access log")}
	}
	cfg, err := rules.LoadAll(configs...)
	if err != nil {
		return err
	}
	var f *os.File
	if positional[0] == "-" {
		f = os.Stdin
	} else if f, err = os.Open(positional[0]); err != nil {
		return err
	}
	defer f.Close()
	opts := sim.ReplayOptions{TopKeys: *top}
	in, gzipped, err := maybeGunzip(f)
	if err != nil {
		return fmt.Errorf("%s: %w", positional[0], err)
	}
	// A progress bar counts the bytes replayed against the file's size: not
	// for a compressed file, nor for a pipe.
	if info, err := f.Stat(); err == nil && info.Mode().IsRegular() && !gzipped && isTerminal(stderr) {
		bar := progressbar.DefaultBytes(info.Size(), "replaying")
		defer bar.Finish()
		opts.Progress = func(n int64) { bar.Set64(n) }
	}
	res, err := sim.Replay(in, cfg, opts)
	if err != nil {
		return err
	}
	if *htmlOut != "" {
		f, err := os.Create(*htmlOut)
		if err != nil {
			return err
		}
		if err := res.WriteHTML(f); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return res.Report().Write(stdout, *format)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// maybeGunzip returns r, decompressed if it starts with gzip's magic bytes
// (a rotated log.1.gz, or zcat's work done here), whatever its name.
func maybeGunzip(r io.Reader) (_ io.Reader, gzipped bool, err error) {
	br := bufio.NewReader(r)
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		return zr, true, err
	}
	return br, false, nil
}
