// Package nginx translates nginx's request limiting (limit_req_zone,
// limit_req, limit_req_status, limit_req_dry_run, and the server and
// location blocks they sit in) into a sluice rule file: `sluice import
// nginx`.
//
// The arithmetic is nginx's (ngx_http_limit_req_module). A zone's state is
// a leaky bucket's excess; a request is refused when its excess would pass
// burst, and the first request of a key leaves an excess of 0. So:
//
//   - burst=B nodelay (or delay=D with D >= B) admits B+1 at once, then one
//     per 1/rate: gcra with burst B+1;
//   - burst=B without nodelay delays the k-th request of a burst by (k-1)/rate
//     and refuses past B waiting: a leaky-queue with burst B (which admits
//     B+1, the first at once); B = 0 is gcra with burst 1;
//   - delay=D with 0 < D < B (two stages: the first D beyond the rate not
//     delayed, the rest delayed by (excess - D)/rate) is that leaky queue
//     with delayAfter: D;
//   - limit_req_status is status: (nginx's default is 503, kept), and
//     limit_req_dry_run on is mode: shadow;
//   - nginx does not count a request whose key is empty: every key source
//     but the client address is onMissingKey: skip.
//
// nginx counts a request by the limits of its one location (the exact
// match, else the longest prefix), inherited from the server or http level
// when the location sets none; sluice applies every rule that matches. The
// translation gives each zone one rule matching exactly the requests whose
// location uses it (match.path, match.notPath, match.host), and checks it:
// every location's paths are probed against nginx's choice of location and
// the rule's match, and a zone that one rule cannot match exactly (used
// with different bursts, or in locations nested across another) is refused
// with the lines named, as are what has no counterpart (regex locations
// with limits in their server, variables sluice cannot key on,
// limit_conn).
package nginx

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ImportFile reads the nginx configuration at path (and what it includes)
// and returns the equivalent rule file.
func ImportFile(path string) ([]byte, error) {
	p := &parser{}
	ds, err := p.parseFile(path)
	if err != nil {
		return nil, err
	}
	return translate(filepath.Base(path), ds)
}

// Import is ImportFile for a configuration in memory, named name in errors;
// include directives are read relative to the working directory.
func Import(name string, src []byte) ([]byte, error) {
	p := &parser{}
	ds, err := p.parse(name, string(src))
	if err != nil {
		return nil, err
	}
	return translate(filepath.Base(name), ds)
}

// zone is a limit_req_zone.
type zone struct {
	name     string
	key      []string // sluice key sources
	skipping bool     // a source may be empty: onMissingKey: skip
	rate     int64
	per      string
	d        *directive
}

// limit is one limit_req, with the status and dry-run setting of where it
// applies.
type limit struct {
	zone    string
	burst   int64
	nodelay bool
	delay   int64
	status  int
	dryRun  bool
	d       *directive
}

// same reports whether two uses of a zone limit alike.
func (a *limit) same(b *limit) bool {
	return a.zone == b.zone && a.burst == b.burst && a.nodelay == b.nodelay && a.delay == b.delay && a.status == b.status && a.dryRun == b.dryRun
}

// settings are the limit_req directives in force at a level.
type settings struct {
	limits []*limit
	status int
	dryRun bool
}

// location is a location block, flattened: nginx requires a nested
// prefix to extend its parent's, so the longest prefix over all of them is
// nginx's choice.
type location struct {
	exact  bool
	path   string
	limits []*limit
	d      *directive
}

// server is a server block and its locations.
type server struct {
	names     []string // exact host names; nil when any host reaches it
	anyHost   bool     // a wildcard, regex or default name
	limits    []*limit // at the server level, inherited
	locations []*location
	d         *directive
}

type importer struct {
	zones   map[string]*zone
	servers []*server
	regex   []*directive // regex locations
}

func translate(name string, top []*directive) ([]byte, error) {
	im := &importer{zones: map[string]*zone{}}
	http := top
	for _, d := range top {
		if d.name == "http" && d.isBlk {
			http = d.block
		}
	}
	base := settings{status: 503}
	if err := im.level(http, &base, nil); err != nil {
		return nil, err
	}
	for _, d := range http {
		if d.name == "server" && d.isBlk {
			if err := im.server(d, base); err != nil {
				return nil, err
			}
		}
	}
	return im.write(name)
}

// level reads the limit_req directives of one block's body into s (which
// holds the parent's), and the zones if it is the http level.
func (im *importer) level(body []*directive, s *settings, srv *server) error {
	var own []*directive
	for _, d := range body {
		switch d.name {
		case "limit_req_zone":
			if srv != nil {
				return fmt.Errorf("%s: limit_req_zone belongs in the http block", d.at())
			}
			z, err := parseZone(d)
			if err != nil {
				return err
			}
			if _, dup := im.zones[z.name]; dup {
				return fmt.Errorf("%s: zone %q is defined twice", d.at(), z.name)
			}
			im.zones[z.name] = z
		case "limit_req":
			own = append(own, d)
		case "limit_req_status":
			if len(d.args) != 1 {
				return fmt.Errorf("%s: limit_req_status: want one status", d.at())
			}
			code, err := strconv.Atoi(d.args[0])
			if err != nil || (code != 429 && code != 503) {
				return fmt.Errorf("%s: limit_req_status %s: sluice refuses with 429 or 503 only", d.at(), d.args[0])
			}
			s.status = code
		case "limit_req_dry_run":
			if len(d.args) != 1 || (d.args[0] != "on" && d.args[0] != "off") {
				return fmt.Errorf("%s: limit_req_dry_run: want on or off", d.at())
			}
			s.dryRun = d.args[0] == "on"
		case "limit_conn", "limit_conn_zone":
			return fmt.Errorf("%s: %s: sluice limits requests, not connections; remove it or keep it in nginx", d.at(), d.name)
		case "limit_req_log_level":
			// Logging only.
		}
	}
	// The level's own limit_req directives replace the parent's, with this
	// level's status and dry-run setting (nginx reads those at the level).
	if len(own) > 0 {
		s.limits = nil
		for _, d := range own {
			l, err := parseLimit(d, s)
			if err != nil {
				return err
			}
			s.limits = append(s.limits, l)
		}
	} else {
		// Inherited limits keep the parent's directives; a status or dry
		// run set here still applies to them.
		for i, l := range s.limits {
			c := *l
			c.status, c.dryRun = s.status, s.dryRun
			s.limits[i] = &c
		}
	}
	return nil
}

func (im *importer) server(d *directive, parent settings) error {
	srv := &server{d: d}
	for _, c := range d.block {
		if c.name != "server_name" {
			continue
		}
		for _, n := range c.args {
			if n == "_" || n == "" || strings.ContainsAny(n, "*~") || strings.HasPrefix(n, ".") {
				srv.anyHost = true
				continue
			}
			srv.names = append(srv.names, strings.ToLower(n))
		}
	}
	if len(srv.names) == 0 {
		srv.anyHost = true
	}
	s := parent
	s.limits = slices.Clone(parent.limits)
	if err := im.level(d.block, &s, srv); err != nil {
		return err
	}
	srv.limits = s.limits
	if err := im.locations(d.block, s, srv); err != nil {
		return err
	}
	im.servers = append(im.servers, srv)
	return nil
}

func (im *importer) locations(body []*directive, parent settings, srv *server) error {
	for _, d := range body {
		if d.name != "location" || !d.isBlk {
			continue
		}
		s := parent
		s.limits = slices.Clone(parent.limits)
		loc := &location{d: d}
		switch {
		case len(d.args) == 2 && d.args[0] == "=":
			loc.exact, loc.path = true, d.args[1]
		case len(d.args) == 2 && d.args[0] == "^~":
			loc.path = d.args[1]
		case len(d.args) == 1 && strings.HasPrefix(d.args[0], "@"):
			continue // named: reached only by an internal redirect
		case len(d.args) == 1 && strings.HasPrefix(d.args[0], "/"):
			loc.path = d.args[0]
		case len(d.args) >= 1 && (d.args[0] == "~" || d.args[0] == "~*"):
			im.regex = append(im.regex, d)
			continue
		default:
			return fmt.Errorf("%s: location %s: want a prefix, = PATH or ^~ PREFIX", d.at(), strings.Join(d.args, " "))
		}
		if err := im.level(d.block, &s, srv); err != nil {
			return err
		}
		loc.limits = s.limits
		srv.locations = append(srv.locations, loc)
		if err := im.locations(d.block, s, srv); err != nil {
			return err
		}
	}
	return nil
}

// parseZone reads limit_req_zone KEY zone=NAME:SIZE rate=Nr/s|Nr/m.
func parseZone(d *directive) (*zone, error) {
	z := &zone{d: d}
	if len(d.args) < 3 {
		return nil, fmt.Errorf("%s: limit_req_zone: want a key, zone=NAME:SIZE and rate=N", d.at())
	}
	for _, a := range d.args[1:] {
		switch {
		case strings.HasPrefix(a, "zone="):
			z.name, _, _ = strings.Cut(strings.TrimPrefix(a, "zone="), ":")
		case strings.HasPrefix(a, "rate="):
			r := strings.TrimPrefix(a, "rate=")
			num, unit := r, "1s"
			switch {
			case strings.HasSuffix(r, "r/s"):
				num = strings.TrimSuffix(r, "r/s")
			case strings.HasSuffix(r, "r/m"):
				num, unit = strings.TrimSuffix(r, "r/m"), "1m"
			default:
				return nil, fmt.Errorf("%s: rate=%s: want Nr/s or Nr/m", d.at(), r)
			}
			n, err := strconv.ParseInt(num, 10, 64)
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("%s: rate=%s: want a whole number of requests above 0", d.at(), r)
			}
			z.rate, z.per = n, unit
		case a == "sync":
			// nginx Plus's zone sync: a shared store in sluice's terms.
		default:
			return nil, fmt.Errorf("%s: limit_req_zone: unknown parameter %q", d.at(), a)
		}
	}
	if z.name == "" || z.rate == 0 {
		return nil, fmt.Errorf("%s: limit_req_zone: want zone=NAME:SIZE and rate=N", d.at())
	}
	key, skipping, err := keySources(d.args[0])
	if err != nil {
		return nil, fmt.Errorf("%s: limit_req_zone key %s: %v", d.at(), d.args[0], err)
	}
	z.key, z.skipping = key, skipping
	return z, nil
}

// keySources maps an nginx key (variables and text) to sluice's key
// sources; literal text does not change whose requests share a count.
func keySources(key string) (sources []string, skipping bool, err error) {
	for i := 0; i < len(key); {
		if key[i] != '$' {
			i++
			continue
		}
		j, name := i+1, ""
		if j < len(key) && key[j] == '{' {
			end := strings.IndexByte(key[j:], '}')
			name, j = key[j+1:j+end], j+end+1
		} else {
			for j < len(key) && (key[j] == '_' || key[j] >= 'a' && key[j] <= 'z' || key[j] >= 'A' && key[j] <= 'Z' || key[j] >= '0' && key[j] <= '9') {
				j++
			}
			name = key[i+1 : j]
		}
		i = j
		var src string
		switch {
		case name == "binary_remote_addr" || name == "remote_addr":
			src = "ip"
		case strings.HasPrefix(name, "http_"):
			src, skipping = "header:"+headerName(strings.TrimPrefix(name, "http_")), true
		case strings.HasPrefix(name, "arg_"):
			src, skipping = "query:"+strings.TrimPrefix(name, "arg_"), true
		case strings.HasPrefix(name, "cookie_"):
			src, skipping = "cookie:"+strings.TrimPrefix(name, "cookie_"), true
		case name == "uri":
			src = "path"
		case name == "request_method":
			src = "method"
		case name == "host" || name == "http_host":
			src = "host"
		default:
			return nil, false, fmt.Errorf("cannot key on $%s (sluice keys on the client address, headers, query parameters, cookies, the path, the method and the host; a map's variable is the usual case: key on what it maps from and use exempt: for its exceptions)", name)
		}
		if !slices.Contains(sources, src) {
			sources = append(sources, src)
		}
	}
	if len(sources) == 0 {
		return nil, false, fmt.Errorf("no variable: every request would share one count")
	}
	return sources, skipping, nil
}

// headerName turns $http_x_api_key's name into the field's, X-Api-Key.
func headerName(v string) string {
	parts := strings.Split(v, "_")
	for i, p := range parts {
		if p != "" {
			parts[i] = strings.ToUpper(p[:1]) + p[1:]
		}
	}
	return strings.Join(parts, "-")
}

// parseLimit reads limit_req zone=NAME [burst=N] [nodelay | delay=N].
func parseLimit(d *directive, s *settings) (*limit, error) {
	l := &limit{d: d, status: s.status, dryRun: s.dryRun}
	for _, a := range d.args {
		var err error
		switch {
		case strings.HasPrefix(a, "zone="):
			l.zone = strings.TrimPrefix(a, "zone=")
		case strings.HasPrefix(a, "burst="):
			l.burst, err = strconv.ParseInt(strings.TrimPrefix(a, "burst="), 10, 64)
		case a == "nodelay":
			l.nodelay = true
		case strings.HasPrefix(a, "delay="):
			l.delay, err = strconv.ParseInt(strings.TrimPrefix(a, "delay="), 10, 64)
		default:
			return nil, fmt.Errorf("%s: limit_req: unknown parameter %q", d.at(), a)
		}
		if err != nil || l.burst < 0 || l.delay < 0 {
			return nil, fmt.Errorf("%s: limit_req %s: want a whole number", d.at(), a)
		}
	}
	if l.zone == "" {
		return nil, fmt.Errorf("%s: limit_req: want zone=NAME", d.at())
	}
	if l.delay >= l.burst && l.delay > 0 {
		l.nodelay = true // nothing in the burst is delayed
	}
	return l, nil
}
