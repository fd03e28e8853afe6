package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/sluice-rl/sluice/rules"
)

func runCheck(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: sluice check FILE...")
		fmt.Fprintln(stderr, "\nValidates rule files. Prints every fault with its file, line, column and")
		fmt.Fprintln(stderr, "field and exits 1; or prints each rule: what it matches, its key, and its")
		fmt.Fprintln(stderr, "burst ceiling in words.")
		fmt.Fprintln(stderr, "\nExample:\n  sluice check examples/shop.yaml")
	}
	positional, help, err := parseArgs(fs, args)
	if help || err != nil {
		return err
	}
	if len(positional) == 0 {
		fs.Usage()
		return errUsage{errors.New("no file")}
	}
	failed := 0
	for _, path := range positional {
		c, err := rules.Load(path)
		if err != nil {
			fmt.Fprintln(stderr, err)
			failed++
			continue
		}
		fmt.Fprintf(stdout, "%s: %d rules\n", path, len(c.Rules))
		for _, r := range c.Rules {
			fmt.Fprintf(stdout, "  %s\n", r.Summary())
		}
		for _, w := range c.Warnings() {
			fmt.Fprintf(stderr, "warning: %s\n", w)
		}
	}
	if failed > 0 {
		return errExit{1}
	}
	return nil
}

// errExit ends the program with a code, its message already printed.
type errExit struct{ code int }

func (e errExit) Error() string { return fmt.Sprintf("exit %d", e.code) }
