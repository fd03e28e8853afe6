package nginx

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/rules"
)

// use is a zone counted in one final region of a server: a location, or
// the server's requests that match no location (loc nil).
type use struct {
	srv *server
	loc *location
	l   *limit
}

// regions lists every final region and the limits in force there.
func (im *importer) regions() []use {
	var out []use
	for _, s := range im.servers {
		for _, l := range s.limits {
			out = append(out, use{s, nil, l})
		}
		for _, loc := range s.locations {
			for _, l := range loc.limits {
				out = append(out, use{s, loc, l})
			}
		}
	}
	return out
}

// patterns are the sluice path patterns of a location: an exact path; a
// prefix ending in "/" as its segments and any below (which also takes the
// prefix without its slash); a prefix without one as itself and any
// segments below (not /loginx for /login: sluice matches whole segments).
func (loc *location) patterns() []string {
	p := loc.path
	switch {
	case loc.exact:
		return []string{p}
	case p == "/":
		return []string{"/*"}
	case strings.HasSuffix(p, "/"):
		return []string{p + "*"}
	}
	return []string{p, p + "/*"}
}

// final is the location nginx picks for path in s: the exact match, else
// the longest prefix; nil for none.
func (s *server) final(path string) *location {
	var best *location
	for _, loc := range s.locations {
		if loc.exact && loc.path == path {
			return loc
		}
		if !loc.exact && strings.HasPrefix(path, loc.path) && (best == nil || len(loc.path) > len(best.path)) {
			best = loc
		}
	}
	return best
}

// probes are paths that tell the locations of s apart: in each location
// and below it (not the cases the translation's comment names).
func (s *server) probes() []string {
	out := []string{"/", "/sluice-probe-none", "/sluice-probe-none/x"}
	for _, loc := range s.locations {
		switch {
		case loc.exact:
			out = append(out, loc.path)
		case strings.HasSuffix(loc.path, "/"):
			out = append(out, loc.path+"x", loc.path+"x/y")
		default:
			out = append(out, loc.path, loc.path+"/x")
		}
	}
	return out
}

func (im *importer) write(name string) ([]byte, error) {
	uses := im.regions()
	var zones []string
	byZone := map[string][]use{}
	for _, u := range uses {
		if _, ok := im.zones[u.l.zone]; !ok {
			return nil, fmt.Errorf("%s: limit_req zone=%s: no limit_req_zone defines it", u.l.d.at(), u.l.zone)
		}
		if _, ok := byZone[u.l.zone]; !ok {
			zones = append(zones, u.l.zone)
		}
		byZone[u.l.zone] = append(byZone[u.l.zone], u)
	}
	sort.Strings(zones)
	if len(im.regex) > 0 && len(uses) > 0 {
		return nil, fmt.Errorf("%s: a regex location: it takes requests from the prefix locations in ways sluice's path patterns cannot follow; translate by hand, or use prefix locations", im.regex[0].at())
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# sluice rules translated from %s by `sluice import nginx`.\n", name)
	b.WriteString("# Where they differ from nginx (docs/http.md, \"Coming from nginx limit_req\"):\n")
	b.WriteString("# sluice matches paths in any case and whole segments (location /login\n")
	b.WriteString("# takes /login/x, not /loginx; location /api/ also takes /api), and a\n")
	b.WriteString("# request over one of several limits is charged to none of them.\n")
	b.WriteString("rules:\n")
	for _, zn := range zones {
		if err := im.rule(&b, im.zones[zn], byZone[zn]); err != nil {
			return nil, err
		}
	}
	out := []byte(b.String())
	cfg, err := rules.Parse(name+" (translated)", out)
	if err != nil {
		return nil, fmt.Errorf("the translation is not a valid rule file (a bug; please report it with the configuration): %v\n%s", err, out)
	}
	if err := im.check(cfg, byZone); err != nil {
		return nil, err
	}
	return out, nil
}

// rule writes the rule of zone z, counted in uses.
func (im *importer) rule(b *strings.Builder, z *zone, uses []use) error {
	l := uses[0].l
	for _, u := range uses[1:] {
		if !u.l.same(l) {
			return fmt.Errorf("%s and %s: zone %s is used with other settings (burst, nodelay, status or dry run): nginx counts both in one zone, and sluice has one limit per count", l.d.at(), u.l.d.at(), z.name)
		}
	}
	lines := []string{l.d.at()}
	var hosts []string
	servers := map[*server]bool{}
	every := false // a server's unlocated requests count
	var paths, notPaths []string
	used := map[*location]bool{}
	for _, u := range uses {
		if at := u.l.d.at(); !slices.Contains(lines, at) {
			lines = append(lines, at)
		}
		servers[u.srv] = true
		if u.loc == nil {
			every = true
		} else {
			used[u.loc] = true
		}
	}
	for s := range servers {
		if len(im.servers) > 1 {
			if s.anyHost {
				return fmt.Errorf("%s: zone %s counts in a server with no exact server_name (a wildcard, a regex or the default), beside other servers: sluice cannot match every host but theirs", s.d.at(), z.name)
			}
			hosts = append(hosts, s.names...)
		}
		for _, loc := range s.locations {
			switch {
			case used[loc] && !every:
				paths = append(paths, loc.patterns()...)
			case !used[loc] && (every || im.under(loc, used)):
				notPaths = append(notPaths, loc.patterns()...)
			}
		}
	}
	sort.Strings(hosts)
	slices.Sort(paths)
	paths = slices.Compact(paths)
	slices.Sort(notPaths)
	notPaths = slices.Compact(notPaths)

	fmt.Fprintf(b, "  # limit_req_zone at %s; limit_req at %s\n", z.d.at(), strings.Join(lines, ", "))
	fmt.Fprintf(b, "  - id: %s\n", ruleID(z.name))
	var match []string
	if len(hosts) > 0 {
		match = append(match, "host: ["+strings.Join(hosts, ", ")+"]")
	}
	if len(paths) > 0 {
		match = append(match, "path: ["+strings.Join(paths, ", ")+"]")
	}
	if len(notPaths) > 0 {
		match = append(match, "notPath: ["+strings.Join(notPaths, ", ")+"]")
	}
	if len(match) > 0 {
		fmt.Fprintf(b, "    match: {%s}\n", strings.Join(match, ", "))
	}
	fmt.Fprintf(b, "    key: [%s]\n", strings.Join(z.key, ", "))
	fmt.Fprintf(b, "    rate: %d\n    per: %s\n", z.rate, z.per)
	switch {
	case l.nodelay || l.burst == 0:
		field(b, fmt.Sprintf("burst: %d", l.burst+1), fmt.Sprintf("nginx's burst=%d, and the one request the rate admits now", l.burst))
		field(b, "algorithm: gcra", "nodelay: the whole burst at once")
	default:
		field(b, fmt.Sprintf("burst: %d", l.burst), fmt.Sprintf("nginx's burst=%d without nodelay: the excess waits its turn", l.burst))
		field(b, "algorithm: leaky-queue", "")
		if l.delay > 0 {
			field(b, fmt.Sprintf("delayAfter: %d", l.delay), fmt.Sprintf("nginx's delay=%d: that many pass at once, the rest wait", l.delay))
		}
		period := time.Minute
		if z.per == "1s" {
			period = time.Second
		}
		if wait := time.Duration(l.burst) * period / time.Duration(z.rate); wait > 10*time.Second {
			fmt.Fprintf(b, "    # nginx delays the last of a burst %v; sluice holds a request at most 10s and refuses the rest\n", wait)
		}
	}
	if l.status == 503 {
		field(b, "status: 503", "nginx's limit_req_status (503 unless set); drop it for 429")
	}
	if l.dryRun {
		field(b, "mode: shadow", "limit_req_dry_run on")
	}
	if z.skipping {
		field(b, "onMissingKey: skip", "nginx counts no request whose key is empty")
	}
	return nil
}

// field writes one field of a rule, and its comment in a column.
func field(b *strings.Builder, f, comment string) {
	if comment == "" {
		fmt.Fprintf(b, "    %s\n", f)
		return
	}
	fmt.Fprintf(b, "    %-24s# %s\n", f, comment)
}

// under reports whether loc lies below a location in used (a longer
// prefix of one, or an exact path within one), where it takes requests
// that location would otherwise have.
func (im *importer) under(loc *location, used map[*location]bool) bool {
	for u := range used {
		if !u.exact && loc != u && strings.HasPrefix(loc.path, u.path) && len(loc.path) > len(u.path) {
			return true
		}
	}
	return false
}

// check probes every server's locations: each zone's rule must match a
// request exactly when nginx counts it in that zone.
func (im *importer) check(cfg *rules.Config, byZone map[string][]use) error {
	for zn, uses := range byZone {
		var r *rules.Rule
		for _, cr := range cfg.Rules {
			if cr.ID == ruleID(zn) {
				r = cr
			}
		}
		for _, s := range im.servers {
			host := "unlisted.invalid"
			if len(s.names) > 0 {
				host = s.names[0]
			}
			for _, p := range s.probes() {
				loc := s.final(p)
				want := false
				for _, u := range uses {
					want = want || u.srv == s && u.loc == loc
				}
				_, got := r.Match.Matches("GET", host, cfg.Paths.MatchForm(p))
				if got != want {
					where := "no location"
					if loc != nil {
						where = "the location at " + loc.d.at()
					}
					return fmt.Errorf("zone %s: one rule cannot match exactly the requests nginx counts in it: nginx %s %s on %s (%s), the rule would %s; translate this zone by hand", zn,
						map[bool]string{true: "counts", false: "does not count"}[want], p, host, where, map[bool]string{true: "count it", false: "not"}[got])
				}
			}
		}
	}
	return nil
}

// ruleID is a zone's name as a rule id.
func ruleID(zone string) string {
	return strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r == '.' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, zone)
}
