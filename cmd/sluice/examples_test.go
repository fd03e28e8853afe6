package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/store/redis/redistest"

	"github.com/sluice-rl/sluice/rules"
	"go.yaml.in/yaml/v3"
)

// serveFlags returns the flags `sluice serve --help` lists.
func serveFlags(t *testing.T) map[string]bool {
	t.Helper()
	_, _, help := runCLI(t, "serve", "--help")
	flags := map[string]bool{}
	for _, line := range strings.Split(help, "\n") {
		if f, ok := strings.CutPrefix(line, "  --"); ok {
			flags[strings.Fields(f)[0]] = true
		}
	}
	if len(flags) < 10 {
		t.Fatalf("serve --help lists %d flags", len(flags))
	}
	return flags
}

// checkServeArgs checks args as `sluice serve` would take them: every flag
// exists, and every address is loopback. It returns the flags' values.
func checkServeArgs(t *testing.T, where string, args []string, flags map[string]bool) map[string]string {
	t.Helper()
	if len(args) == 0 || args[0] != "serve" {
		t.Fatalf("%s: %q does not run sluice serve", where, args)
	}
	vals := map[string]string{}
	for i := 1; i < len(args); i++ {
		name, ok := strings.CutPrefix(args[i], "--")
		if !ok || !flags[name] {
			t.Fatalf("%s: %q is not a flag of sluice serve", where, args[i])
		}
		if i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			vals[name] = args[i+1]
			i++
		}
	}
	for _, f := range []string{"listen", "grpc-listen"} {
		if v, ok := vals[f]; ok && !strings.HasPrefix(v, "127.0.0.1:") {
			t.Errorf("%s: --%s %s is not loopback", where, f, v)
		}
	}
	return vals
}

// runAsWritten starts the binary with args, the rule file and listen
// address replaced by a test's own, and checks that it serves and that
// `sluice probe` finds it ready.
func runAsWritten(t *testing.T, args []string, vals map[string]string, rulesSrc string) {
	t.Helper()
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rulesPath, []byte(rulesSrc), 0o600)
	var run []string
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--config":
			run = append(run, args[i], rulesPath)
			i++
		case "--listen", "--grpc-listen":
			run = append(run, args[i], "127.0.0.1:0")
			i++
		default:
			run = append(run, args[i])
		}
	}
	base, _ := start(t, run...)
	if code, _, errs := runCLI(t, "probe", base+"/readyz"); code != 0 {
		t.Fatalf("sluice %s: probe of /readyz exit %d: %s", strings.Join(run, " "), code, errs)
	}
}

// The systemd unit runs sluice serve with flags it has, on loopback, reloads
// with SIGHUP, and its command line serves.
func TestSystemdUnitRunsAsWritten(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	f, err := os.Open("../../examples/systemd/sluice.service")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	keys := map[string]string{}
	sections := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			sections[line] = true
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("not a key=value line: %q", line)
			}
			keys[k] = v
		}
	}
	for _, s := range []string{"[Unit]", "[Service]", "[Install]"} {
		if !sections[s] {
			t.Errorf("no %s section", s)
		}
	}
	exec := strings.Fields(keys["ExecStart"])
	if len(exec) < 2 || filepath.Base(exec[0]) != "sluice" {
		t.Fatalf("ExecStart=%s", keys["ExecStart"])
	}
	vals := checkServeArgs(t, "ExecStart", exec[1:], serveFlags(t))
	if keys["ExecReload"] != "/bin/kill -HUP $MAINPID" {
		t.Errorf("ExecReload=%s, want a SIGHUP", keys["ExecReload"])
	}
	runAsWritten(t, exec[1:], vals, "rules:\n  - {id: a, key: [ip], rate: 5, per: 1s}\n")
}

// The Kubernetes manifest: its ConfigMap's rules load; the sidecar runs
// sluice serve with flags it has, on loopback, mounts the rules where
// --config looks, names only variables that stand for flags, and probes
// with `sluice probe` on its own listener. Its command line serves.
func TestKubernetesManifestRunsAsWritten(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	f, err := os.Open("../../examples/kubernetes/sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rulesSrc string
	sidecars := 0
	dec := yaml.NewDecoder(f)
	for {
		var doc struct {
			Kind string
			Data map[string]string
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Name, Image  string
							Args         []string
							Env          []struct{ Name string }
							VolumeMounts []struct {
								MountPath string `yaml:"mountPath"`
							} `yaml:"volumeMounts"`
							ReadinessProbe struct{ Exec struct{ Command []string } } `yaml:"readinessProbe"`
							LivenessProbe  struct{ Exec struct{ Command []string } } `yaml:"livenessProbe"`
						}
					}
				}
			}
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		switch doc.Kind {
		case "ConfigMap":
			rulesSrc = doc.Data["rules.yaml"]
		case "Deployment":
			for _, c := range doc.Spec.Template.Spec.Containers {
				if c.Name != "sluice" {
					continue
				}
				if doc, _ := os.ReadFile("../../docs/operations.md"); c.Image == "" || !strings.Contains(string(doc), c.Image) {
					t.Errorf("the sluice container's image %q is not the one docs/operations.md builds", c.Image)
				}
				flags := serveFlags(t)
				vals := checkServeArgs(t, "the sluice container", c.Args, flags)
				if len(c.VolumeMounts) != 1 || filepath.Dir(vals["config"]) != c.VolumeMounts[0].MountPath {
					t.Errorf("--config %s is not in the mounted rules %+v", vals["config"], c.VolumeMounts)
				}
				names := map[string]bool{}
				for f := range flags {
					names[envName(f)] = true
				}
				for _, e := range c.Env {
					if !names[e.Name] {
						t.Errorf("variable %s stands for no flag", e.Name)
					}
				}
				for probe, cmd := range map[string][]string{"/readyz": c.ReadinessProbe.Exec.Command, "/healthz": c.LivenessProbe.Exec.Command} {
					if want := []string{"sluice", "probe", "http://" + vals["listen"] + probe}; strings.Join(cmd, " ") != strings.Join(want, " ") {
						t.Errorf("probe %q, want %q", cmd, want)
					}
				}
				if _, err := rules.Parse("configmap", []byte(rulesSrc)); rulesSrc == "" || err != nil {
					t.Fatalf("the ConfigMap's rules (before the Deployment): %v", err)
				}
				runAsWritten(t, c.Args, vals, rulesSrc)
				sidecars++
			}
		}
	}
	if sidecars != 1 {
		t.Fatalf("%d sluice containers in the Deployment, want 1", sidecars)
	}
}

// scrapeMetricNames returns the sample names a real /metrics scrape of the
// built binary serves (a histogram's _bucket, _sum and _count included).
func scrapeMetricNames(t *testing.T) map[string]bool {
	t.Helper()
	base, _ := startServe(t, "--config", "../../examples/shop.yaml")
	for _, body := range []string{`{"attributes":{"user":"u1"}}`, `{"request":{"path":"/export/a"},"attributes":{"user":"u1"}}`} {
		resp, err := http.Post(base+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	names := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			names[f[2]] = true
			if f[3] == "histogram" {
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					names[f[2]+s] = true
				}
			}
		}
	}
	if len(names) < 10 {
		t.Fatalf("the scrape has %d metrics", len(names))
	}
	return names
}

var sluiceMetric = regexp.MustCompile(`\bsluice_[a-z0-9_]+`)

// checkMetricsExist reports every sluice metric named in exprs that a real
// scrape does not serve.
func checkMetricsExist(t *testing.T, where string, exprs []string, served map[string]bool) {
	t.Helper()
	used := 0
	for _, e := range exprs {
		for _, m := range sluiceMetric.FindAllString(e, -1) {
			used++
			if !served[m] {
				t.Errorf("%s uses %s, which /metrics does not serve: %s", where, m, e)
			}
		}
	}
	if used < 5 {
		t.Errorf("%s names %d sluice metrics: the check checks little", where, used)
	}
}

// needTool returns a tool's path, skipping the test loudly without it, or
// failing in CI, which installs it.
func needTool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if redistest.CI() {
			t.Fatalf("%s not found: CI must install the %s package", name, pkg)
		}
		t.Skipf("SKIPPED LOUDLY: %s not found (apt-get install %s)", name, pkg)
	}
	return p
}

// The alert rules use only metrics sluice serves, pass promtool's check,
// and fire (or not) as their unit tests say.
func TestPrometheusAlertsAreValid(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	b, err := os.ReadFile("../../examples/prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Rules []struct {
				Alert, Expr string
			}
		}
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	checkMetricsExist(t, "alerts.yaml", exprs, scrapeMetricNames(t))
	promtool := needTool(t, "promtool", "prometheus")
	for _, args := range [][]string{{"check", "rules", "alerts.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "../../examples/prometheus"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// The Grafana dashboard is valid JSON whose every query names only metrics
// sluice serves.
func TestGrafanaDashboardUsesServedMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	b, err := os.ReadFile("../../examples/grafana/sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct{ Query any }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(string); ok {
			exprs = append(exprs, q)
		}
	}
	if dash.Title == "" || len(dash.Panels) < 8 {
		t.Fatalf("dashboard %q with %d panels", dash.Title, len(dash.Panels))
	}
	checkMetricsExist(t, "sluice.json", exprs, scrapeMetricNames(t))
}
