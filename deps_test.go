package sluice_test

import (
	"os/exec"
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
	library := []string{".", "./algo", "./httplimit", "./engine", "./store/...", "./rules", "./client", "./concurrency", "./share"}
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
