// Command sluice is the sluice rate limiter as a program.
//
//	sluice serve --config FILE [--listen 127.0.0.1:8080]
//	sluice gateway --config FILE --upstream URL [--listen 127.0.0.1:8080]
//	sluice check FILE...
//	sluice import nginx NGINX_CONF
//	sluice override set|ls|rm [flags]
//	sluice estimate --keys 10M --limit 100/1m [--active 5%]
//	sluice replay --config RULES ACCESS_LOG
//	sluice simulate SCENARIO [--format table|json|csv]
//	sluice version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// command is one subcommand of sluice.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"serve", "serve the decision API, Envoy's gRPC service, forward-auth and metrics", runServe},
		{"gateway", "a reverse proxy that applies the rules in front of a service", runGateway},
		{"check", "validate rule files and describe their rules", runCheck},
		{"import", "translate nginx's limit_req configuration into a rule file", runImport},
		{"test", "run requests through rules and compare the decisions with those expected", runTest},
		{"simulate", "run a scenario through the real algorithms and store", runSimulate},
		{"replay", "replay an access log through rules: what would they reject?", runReplay},
		{"estimate", "estimate memory for a limit over many keys, measured", runEstimate},
		{"override", "change a rule for some keys in a running sluice: set, ls, rm", runOverride},
		{"probe", "ask a running sluice for /healthz or /readyz: exit 0 when healthy", runProbe},
		{"version", "print the version", runVersion},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) > 1 && os.Args[1] == "gateway" {
		setGatewayProcs() // the process's, not run's: tests call run in theirs
	}
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// errUsage marks an error whose usage text has already been printed.
type errUsage struct{ error }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 2 && args[0] == "help" {
		args = []string{args[1], "--help"} // sluice help serve: serve's page
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name == args[0] {
			if err := c.run(ctx, args[1:], stdout, stderr); err != nil {
				var exit errExit
				if errors.As(err, &exit) {
					return exit.code
				}
				// A library error names its package ("sluice: limit ...",
				// "rules: open ..."): the command's name says it here.
				msg := strings.TrimPrefix(strings.TrimPrefix(err.Error(), "sluice: "), "rules: ")
				fmt.Fprintf(stderr, "sluice %s: %s\n", c.name, msg)
				if _, ok := err.(errUsage); ok {
					fmt.Fprintf(stderr, "Run 'sluice %s --help' for its flags and an example.\n", c.name)
					return 2 // the command was given wrong: nothing was done
				}
				return 1 // the command failed while running
			}
			return 0
		}
	}
	fmt.Fprintf(stderr, "sluice: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "sluice: a rate limiter for HTTP and gRPC APIs")
	fmt.Fprintln(w, "\nUsage: sluice COMMAND [flags]   (sluice COMMAND --help for an example)")
	fmt.Fprintln(w, "\nCommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
}

// parseArgs parses fs's flags wherever they stand among args and returns
// the other arguments. help reports --help (usage printed: nothing to do).
func parseArgs(fs *flag.FlagSet, args []string) (positional []string, help bool, err error) {
	// The flag package prints the whole usage on any mistake; a mistake
	// gets one line naming it instead (see run), --help the whole page.
	out, usage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	defer func() { fs.SetOutput(out); fs.Usage = usage }()
	if err := flagsFromEnv(fs); err != nil {
		return nil, false, err
	}
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(out)
				usage()
				return nil, true, nil
			}
			return nil, false, errUsage{err}
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, false, nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

// envName is the environment variable of a flag: SLUICE_ and the flag's
// name in upper case, dashes as underscores (--store-timeout-max is
// SLUICE_STORE_TIMEOUT_MAX).
func envName(flagName string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// listFlags take their variable as a comma-separated list, read by the
// command itself and only when the command line gives none of them.
var listFlags = map[string]bool{"config": true}

// flagsFromEnv sets every flag of fs whose variable is set: the variable
// stands for the flag, and the command line, parsed after, overrides it.
func flagsFromEnv(fs *flag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		v, ok := os.LookupEnv(envName(f.Name))
		if !ok || err != nil || listFlags[f.Name] {
			return
		}
		if e := fs.Set(f.Name, v); e != nil {
			err = errUsage{fmt.Errorf("$%s=%q: %v", envName(f.Name), v, e)}
		}
	})
	return err
}

// printFlags writes fs's flags as the docs spell them, --name, each with
// its variable and default.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		fmt.Fprintf(w, "  --%s", f.Name)
		if typ != "" {
			fmt.Fprintf(w, " %s", typ)
		}
		fmt.Fprintf(w, "\n    \t%s", usage)
		if d := f.DefValue; d != "" && d != "false" && d != "0" && d != "0s" && d != "[]" {
			fmt.Fprintf(w, " (default %s)", d)
		}
		if listFlags[f.Name] {
			fmt.Fprintf(w, " [$%s, comma-separated]\n", envName(f.Name))
			return
		}
		fmt.Fprintf(w, " [$%s]\n", envName(f.Name))
	})
}

// plural writes n and a noun that takes an s: "1 rule", "6 rules".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
