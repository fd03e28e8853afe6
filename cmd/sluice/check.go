package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sluice-rl/sluice/rules"
)

func runCheck(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	region := fs.String("region", "", "describe rules with regions as a gateway of this region enforces them")
	merge := fs.Bool("merge-domains", os.Getenv("MERGE_DOMAIN_CONFIG") == "true" || os.Getenv("SLUICE_MERGE_DOMAINS") == "true", "as serve's: several envoyproxy/ratelimit files may declare one domain")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: sluice check [--region NAME] [--merge-domains] FILE...")
		fmt.Fprintln(stderr, "\nValidates rule files, each alone and together as serve loads them (rule ids")
		fmt.Fprintln(stderr, "unique across the files). Prints every fault with its file, line, column and")
		fmt.Fprintln(stderr, "field and exits 1; or prints each rule: what it matches, its key, and its")
		fmt.Fprintln(stderr, "burst ceiling in words.")
		fmt.Fprintln(stderr, "\nExample:\n  sluice check examples/shop.yaml")
	}
	positional, help, err := parseArgs(fs, args)
	if help || err != nil {
		return err
	}
	if len(positional) == 0 {
		return errUsage{errors.New("no file")}
	}
	failed := 0
	var cfgs []*rules.Config
	for _, path := range positional {
		c, err := rules.Load(path)
		if err != nil {
			if es := (rules.Errors)(nil); errors.As(err, &es) {
				fmt.Fprintln(stderr, err) // one fault per line, file:line:column first
			} else {
				fmt.Fprintf(stderr, "sluice check: %s\n", strings.TrimPrefix(err.Error(), "rules: "))
			}
			failed++
			continue
		}
		cfgs = append(cfgs, c)
		fmt.Fprintf(stdout, "%s: %s\n", path, plural(len(c.Rules), "rule"))
		for _, r := range c.Rules {
			fmt.Fprintf(stdout, "  %s\n", r.SummaryIn(*region))
		}
		for _, w := range c.Warnings() {
			fmt.Fprintf(stderr, "warning: %s\n", w)
		}
	}
	// The files are served together: what only their union gets wrong
	// (a rule id in two files, IPv6 prefixes that differ) is refused too.
	if failed == 0 && len(cfgs) > 1 {
		if _, err := (rules.LoadOptions{MergeDomains: *merge}).Merge(cfgs...); err != nil {
			fmt.Fprintln(stderr, err)
			failed++
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
