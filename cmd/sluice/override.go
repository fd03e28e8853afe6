package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-rl/sluice/overrides"
	"github.com/sluice-rl/sluice/server"
)

// runOverride changes an operator's override through a running sluice's
// admin API (/v1/overrides): set, ls, rm.
func runOverride(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "set" && args[0] != "ls" && args[0] != "rm") {
		if len(args) > 0 && (args[0] == "--help" || args[0] == "-h") {
			overrideUsage(stderr)
			return nil
		}
		overrideUsage(stderr)
		return errUsage{errors.New("want set, ls or rm")}
	}
	verb, args := args[0], args[1:]
	fs := flag.NewFlagSet("override "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	base := fs.String("url", envDefault("SLUICE_URL", "http://127.0.0.1:8080"), "the sluice to ask: serve's listener, or a gateway's --admin-listen (http://127.0.0.1:9091)")
	token := fs.String("admin-token", "", "bearer token for the admin endpoints [$SLUICE_ADMIN_TOKEN]")
	who := fs.String("by", defaultWho(), "who makes the change (logged and listed)")
	reason := fs.String("reason", "", "why (required for set and rm; logged and listed)")
	version := fs.Int64("version", 0, "replace or remove only this version of the override (its ETag); set without it only creates")
	var (
		rule, key, prefix, action, per, expires *string
		rate, burst                             *int64
		forD                                    *time.Duration
		untilRemoved, asJSON                    *bool
		keyValues                               = keyValueFlag{}
	)
	switch verb {
	case "set":
		rule = fs.String("rule", "", "the rule to change (its id)")
		fs.Var(keyValues, "key-value", "a key source's value, `NAME=VALUE` (repeat for each of the rule's sources), built as the rules build the key")
		key = fs.String("key", "", "for a rule keyed by one source, its value (instead of --key-value): built as the rules build it, an IPv6 address as the prefix counted, a hashed source hashed")
		prefix = fs.String("prefix", "", "every key starting with this (a rule keyed by one plain source)")
		action = fs.String("action", "", "limit, exempt or block")
		rate = fs.Int64("rate", 0, "for limit: units per --per")
		per = fs.String("per", "", "for limit: the period of --rate, such as 1m")
		burst = fs.Int64("burst", 0, "for limit: the burst (0: the rate)")
		forD = fs.Duration("for", 0, "how long it lasts from now, such as 2h")
		expires = fs.String("expires", "", "when it ends, RFC 3339 (instead of --for)")
		untilRemoved = fs.Bool("until-removed", false, "no end: it lasts until sluice override rm")
	case "ls":
		asJSON = fs.Bool("json", false, "print the JSON the API answers")
	}
	fs.Usage = func() { overrideUsage(stderr); fmt.Fprintln(stderr, "\nFlags:"); printFlags(stderr, fs) }
	positional, help, err := parseArgs(fs, args)
	if help || err != nil {
		return err
	}
	if *token == "" {
		*token = os.Getenv("SLUICE_ADMIN_TOKEN")
	}
	u, err := url.Parse(*base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errUsage{fmt.Errorf("--url %q: want http://HOST:PORT", *base)}
	}
	api := &adminAPI{ctx: ctx, base: u, token: *token, flags: fs}
	switch verb {
	case "ls":
		if len(positional) > 0 {
			return errUsage{errors.New("ls takes no arguments")}
		}
		return listOverrides(api, stdout, *asJSON)
	case "rm":
		if len(positional) != 1 {
			return errUsage{errors.New("rm takes one override id (sluice override ls lists them)")}
		}
		if *reason == "" {
			return errUsage{errors.New("--reason: why it is removed (it is logged)")}
		}
		return removeOverride(api, stdout, positional[0], *version, *who, *reason)
	}
	if len(positional) > 0 {
		return errUsage{fmt.Errorf("unexpected %q: set takes flags only", positional[0])}
	}
	req := server.OverrideRequest{Rule: *rule, KeyValues: keyValues, Key: *key, Prefix: *prefix, Action: *action,
		Rate: *rate, Per: *per, Burst: *burst, Expires: *expires, UntilRemoved: *untilRemoved, Reason: *reason, By: *who}
	if *forD != 0 {
		req.For = forD.String()
	}
	return setOverride(api, stdout, req, *version)
}

// adminAPI calls a running sluice's admin API for the override command.
type adminAPI struct {
	ctx   context.Context
	base  *url.URL
	token string
	flags *flag.FlagSet // the command's: a 400's field is named by its flag
}

// call sends a request of body (as JSON, if not nil) to path, within 10 s,
// and returns the answer; an answer other than 2xx is an error with the
// problem's detail and a hint of what to do.
func (a *adminAPI) call(method, path string, body any, header map[string]string) (*http.Response, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(a.ctx, 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, strings.TrimRight(a.base.String(), "/")+path, rd)
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if resp.StatusCode/100 == 2 {
		return resp, b, nil
	}
	var p struct{ Detail, Field string }
	if json.Unmarshal(b, &p) != nil || p.Detail == "" {
		return resp, b, fmt.Errorf("%s answered %s", a.base, resp.Status)
	}
	hint := ""
	if f := a.flags.Lookup(flagOfField(p.Field)); f != nil && resp.StatusCode == http.StatusBadRequest {
		hint = " (--" + f.Name + ")"
	}
	switch resp.StatusCode {
	case http.StatusPreconditionRequired:
		hint = " (sluice override ls gives its version: set --version V replaces it)"
	case http.StatusPreconditionFailed:
		hint = " (sluice override ls gives its version now)"
	}
	return resp, b, fmt.Errorf("%s: %s%s", resp.Status, p.Detail, hint)
}

// ifVersion is the If-Match header of a change of version v (0: none).
func ifVersion(v int64) map[string]string {
	h := map[string]string{}
	if v > 0 {
		h["If-Match"] = strconv.Quote(strconv.FormatInt(v, 10))
	}
	return h
}

// listOverrides prints the overrides in force: a table, or the API's JSON.
func listOverrides(api *adminAPI, stdout io.Writer, asJSON bool) error {
	_, body, err := api.call(http.MethodGet, "/v1/overrides", nil, nil)
	if err != nil {
		return err
	}
	if asJSON {
		stdout.Write(body)
		return nil
	}
	var list server.OverridesResponse
	if err := json.Unmarshal(body, &list); err != nil {
		return err
	}
	printOverrides(stdout, list)
	return nil
}

// removeOverride removes override id (version, if not 0), saying who and
// why.
func removeOverride(api *adminAPI, stdout io.Writer, id string, version int64, who, reason string) error {
	q := url.Values{"by": {who}, "reason": {reason}}
	_, body, err := api.call(http.MethodDelete, "/v1/overrides/"+url.PathEscape(id)+"?"+q.Encode(), nil, ifVersion(version))
	if err != nil {
		return err
	}
	var o overrides.Override
	json.Unmarshal(body, &o)
	fmt.Fprintf(stdout, "removed %s (rule %s, %s)\n", o.ID, o.Rule, o.Action)
	return nil
}

// setOverride creates an override, or replaces version of it.
func setOverride(api *adminAPI, stdout io.Writer, req server.OverrideRequest, version int64) error {
	resp, body, err := api.call(http.MethodPut, "/v1/overrides", req, ifVersion(version))
	if err != nil {
		return err
	}
	var o overrides.Override
	if err := json.Unmarshal(body, &o); err != nil {
		return err
	}
	done := "set"
	if resp.StatusCode == http.StatusOK {
		done = "replaced"
	}
	fmt.Fprintf(stdout, "%s %s version %d: rule %s, %s, %s\n", done, o.ID, o.Version, o.Rule, what(&o), until(&o))
	return nil
}

func overrideUsage(w io.Writer) {
	fmt.Fprintln(w, "Usage: sluice override set|ls|rm [flags]")
	fmt.Fprintln(w, "\nChanges a rule for some keys in a running sluice, without a deploy: every")
	fmt.Fprintln(w, "process on the same store enforces the change within a second.")
	fmt.Fprintln(w, "\nExamples:")
	fmt.Fprintln(w, "  sluice override set --rule per-key --key-value api_key=k-partner --action limit --rate 5000 --per 1m --for 72h --reason 'launch week'")
	fmt.Fprintln(w, "  sluice override set --rule per-key --key-value api_key=k-stolen --action block --until-removed --reason 'leaked key'")
	fmt.Fprintln(w, "  sluice override set --rule per-user --prefix loadtest- --action exempt --for 1h --reason 'load test'")
	fmt.Fprintln(w, "  sluice override ls")
	fmt.Fprintln(w, "  sluice override rm 3f9a1c2b7d4e5f60 --reason 'launch over'")
}

// flagOfField names the flag that sets an API field.
func flagOfField(field string) string {
	switch field {
	case "keyValues":
		return "key-value"
	case "untilRemoved":
		return "until-removed"
	}
	return field
}

// keyValueFlag gathers --key-value NAME=VALUE.
type keyValueFlag map[string]string

func (k keyValueFlag) String() string { return "" }
func (k keyValueFlag) Set(s string) error {
	name, value, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return fmt.Errorf("%q: want NAME=VALUE, such as user=u42", s)
	}
	k[name] = value
	return nil
}

func defaultWho() string {
	user := os.Getenv("USER")
	if user == "" {
		user = "someone"
	}
	host, _ := os.Hostname()
	return user + "@" + host
}

func what(o *overrides.Override) string {
	on := "key " + strconv.Quote(o.Key)
	if o.Prefix != "" {
		on = "keys starting " + strconv.Quote(o.Prefix)
	}
	switch o.Action {
	case overrides.Limit:
		burst := o.Burst
		if burst == 0 {
			burst = o.Rate
		}
		return fmt.Sprintf("%s: %d per %v (burst %d)", on, o.Rate, o.Per.D(), burst)
	}
	return on + ": " + string(o.Action)
}

func until(o *overrides.Override) string {
	if o.UntilRemoved {
		return "until removed"
	}
	return "until " + o.Expires.Local().Format(time.RFC3339)
}

func printOverrides(w io.Writer, list server.OverridesResponse) {
	if len(list.Overrides) == 0 {
		fmt.Fprintf(w, "no overrides in force (version %d)\n", list.Version)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tVERSION\tRULE\tWHAT\tUNTIL\tBY\tREASON")
	for _, o := range list.Overrides {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", o.ID, o.Version, o.Rule, what(o), until(o), o.By, o.Reason)
	}
	tw.Flush()
}
