package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/sluice-rl/sluice/rules/nginx"
)

// runImport is `sluice import nginx FILE`: nginx's limit_req configuration
// as a rule file, on stdout or in --output.
func runImport(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("import", flag.ContinueOnError)
	fs.SetOutput(stderr)
	output := fs.String("output", "", "write the rule file here instead of to stdout (refused if it exists)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: sluice import nginx [--output FILE] NGINX_CONF")
		fmt.Fprintln(stderr, "\nTranslates nginx's request limits (limit_req_zone, limit_req with burst,")
		fmt.Fprintln(stderr, "nodelay and delay=, limit_req_status, limit_req_dry_run, and the server and")
		fmt.Fprintln(stderr, "location blocks they sit in, includes read) into an equivalent rule file,")
		fmt.Fprintln(stderr, "commented: nginx's burst arithmetic kept, each zone matching exactly the")
		fmt.Fprintln(stderr, "requests its locations take. What has no counterpart is refused with its")
		fmt.Fprintln(stderr, "file and line.")
		fmt.Fprintln(stderr, "\nExample:\n  sluice import nginx /etc/nginx/nginx.conf > rules.yaml && sluice check rules.yaml")
		fmt.Fprintln(stderr, "\nFlags:")
		printFlags(stderr, fs)
	}
	positional, help, err := parseArgs(fs, args)
	if help || err != nil {
		return err
	}
	if len(positional) != 2 || positional[0] != "nginx" {
		return errUsage{errors.New("want: sluice import nginx NGINX_CONF")}
	}
	out, err := nginx.ImportFile(positional[1])
	if err != nil {
		return fmt.Errorf("sluice import nginx: %w", err)
	}
	if *output == "" {
		_, err = stdout.Write(out)
		return err
	}
	f, err := os.OpenFile(*output, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(out); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
