package sluice_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The library a user imports (the middleware, the engine, the stores, the
// rules, the client, the concurrency limiter) depends on none of the
// service's heavy dependencies: tracing reaches the pipeline through
// httplimit.Tracer, declared where it is used.
func TestTheLibraryDoesNotImportTheServicesDependencies(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	library := []string{".", "./algo", "./httplimit", "./engine", "./store/...", "./rules", "./client", "./concurrency", "./share", "./overrides", "./storecall"}
	out, err := exec.Command("go", append([]string{"list", "-deps"}, library...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	forbidden := []string{"go.opentelemetry.io/", "google.golang.org/grpc", "github.com/valyala/fasthttp", "github.com/prometheus/", "github.com/chromedp/", "github.com/envoyproxy/"}
	for _, pkg := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if strings.HasPrefix(pkg, f) {
				t.Errorf("the library imports %s", pkg)
			}
		}
	}
}

// grpc-go is compiled into the packages that speak gRPC and into nothing
// else: the gateway, the decision service and the library build without
// it.
func TestOnlyThePackagesThatSpeakGRPCImportGRPCGo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	speakers := []string{
		"github.com/sluice-rl/sluice/cmd/sluice",                // wires them
		"github.com/sluice-rl/sluice/envoy",                     // Envoy's rate limit service
		"github.com/sluice-rl/sluice/envoy/xds",                 // an xDS client
		"github.com/sluice-rl/sluice/grpclimit",                 // interceptors for gRPC services
		"github.com/sluice-rl/sluice/internal/testkit/xdstest",  // an xDS server, for tests
		"github.com/sluice-rl/sluice/rlqs",                      // Envoy's Rate Limit Quota Service
		"github.com/sluice-rl/sluice/internal/testkit/rlqstest", // Envoy's quota filter, for tests
	}
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := fields[0]
		if !strings.HasPrefix(pkg, "github.com/sluice-rl/sluice") {
			continue
		}
		seen++
		if slices.Contains(fields[1:], "google.golang.org/grpc") && !slices.Contains(speakers, pkg) {
			t.Errorf("%s imports grpc-go, but speaks no gRPC", pkg)
		}
	}
	if seen < 20 {
		t.Fatalf("go list named %d of sluice's packages: the check saw too little", seen)
	}
}

// Each deployable face is a package of its own and imports none of the
// others: the gateway, the Envoy side and the decision service meet only in
// cmd/sluice (and share package metrics).
func TestTheFacesDoNotImportEachOther(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	faces := []string{"github.com/sluice-rl/sluice/gateway", "github.com/sluice-rl/sluice/envoy", "github.com/sluice-rl/sluice/server"}
	for _, face := range faces {
		out, err := exec.Command("go", "list", "-deps", face).CombinedOutput()
		if err != nil {
			t.Fatalf("go list: %v\n%s", err, out)
		}
		deps := strings.Fields(string(out))
		for _, other := range faces {
			if other != face && slices.Contains(deps, other) {
				t.Errorf("%s imports %s", face, other)
			}
		}
	}
}

// Every file groups its imports as gofmt and goimports leave them: the
// standard library in one group, modules after it, never mixed in one
// group (a group is a run of lines without a blank one).
func TestImportGroupsDoNotMixTheStandardLibraryAndModules(t *testing.T) {
	files, err := exec.Command("git", "ls-files", "*.go").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (not a checkout)", err)
	}
	for _, name := range strings.Fields(string(files)) {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		prevLine, prevStd := -2, false
		for _, imp := range f.Imports {
			line := fset.Position(imp.Pos()).Line
			path := strings.Trim(imp.Path.Value, `"`)
			std := !strings.Contains(strings.SplitN(path, "/", 2)[0], ".")
			if line == prevLine+1 && std != prevStd {
				t.Errorf("%s:%d: %s shares an import group with the other kind (standard library and modules)", name, line, path)
			}
			prevLine, prevStd = line, std
		}
	}
}

// Every package a library user imports shows how it is used in a runnable
// example (go doc lists it, go test runs it and checks its output), in
// its example_test.go.
func TestEveryLibraryPackageHasAnExample(t *testing.T) {
	for _, dir := range []string{".", "store/memory", "store/redis", "rules", "engine", "httplimit", "client", "concurrency", "overrides", "grpclimit"} {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, filepath.Join(dir, "example_test.go"), nil, 0)
		if err != nil {
			t.Errorf("%s: %v", dir, err)
			continue
		}
		found := false
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Example") {
				found = true
			}
		}
		if !found {
			t.Errorf("%s/example_test.go has no Example function", dir)
		}
	}
}
