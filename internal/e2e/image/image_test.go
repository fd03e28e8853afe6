// Package image builds the container image of the repository's Dockerfile
// with buildah, as CI does, and runs it: its entrypoint serves, as the
// unprivileged user, and its health check answers.
package image

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// buildah runs buildah on storage of the test's own (vfs: no kernel
// overlay needed), and returns its output.
type buildah struct {
	t          *testing.T
	root, run  string
	lastOutput string
}

func (b *buildah) cmd(args ...string) *exec.Cmd {
	return exec.Command("buildah", append([]string{"--root", b.root, "--runroot", b.run, "--storage-driver", "vfs"}, args...)...)
}

func (b *buildah) do(args ...string) string {
	b.t.Helper()
	out, err := b.cmd(args...).CombinedOutput()
	if err != nil {
		b.t.Fatalf("buildah %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func TestTheImageServesAsAnUnprivilegedUser(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a container image")
	}
	if _, err := exec.LookPath("buildah"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("buildah is not installed (CI installs it: apt-get install buildah)")
		}
		t.Skip("SKIPPED LOUDLY: buildah is not installed; the container image is not built (apt-get install buildah)")
	}
	const certs = "/etc/ssl/certs/ca-certificates.crt"
	if _, err := os.Stat(certs); err != nil {
		t.Fatalf("no CA certificates to copy in (%v): apt-get install ca-certificates", err)
	}
	// The context: the static binary and the CA certificates, as the
	// Dockerfile's header says.
	ctxDir := t.TempDir()
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version=v0.0.0-image-test",
		"-o", filepath.Join(ctxDir, "sluice"), "github.com/sluice-rl/sluice/cmd/sluice")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("static build: %v\n%s", err, out)
	}
	pem, err := os.ReadFile(certs)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ctxDir, "ca-certificates.crt"), pem, 0o644); err != nil {
		t.Fatal(err)
	}
	store := t.TempDir()
	b := &buildah{t: t, root: filepath.Join(store, "root"), run: filepath.Join(store, "run")}
	b.do("bud", "--isolation", "chroot", "--format", "docker", "-f", "../../../Dockerfile", "-t", "sluice:test", ctxDir)
	t.Cleanup(func() { b.cmd("rmi", "--all", "--force").Run() })

	// What the image says of itself.
	ctr := b.do("from", "localhost/sluice:test")
	t.Cleanup(func() { b.cmd("rm", ctr).Run() })
	cfg := strings.Fields(b.do("inspect", "--format", "{{.Docker.Config.User}} {{index .Docker.Config.Entrypoint 0}} {{index .Docker.Config.Cmd 0}}", ctr))
	if len(cfg) != 3 || cfg[0] != "65532:65532" || cfg[1] != "/usr/local/bin/sluice" || cfg[2] != "serve" {
		t.Fatalf("image config (user, entrypoint, command): %q", cfg)
	}
	if env := b.do("inspect", "--format", "{{.Docker.Config.Env}}", ctr); !strings.Contains(env, "PATH=/usr/local/bin") {
		t.Fatalf("image environment %s: want PATH=/usr/local/bin, for exec probes that name sluice", env)
	}
	size := b.do("images", "--format", "{{.Size}}", "localhost/sluice:test")
	if mb, err := strconv.ParseFloat(strings.TrimSuffix(size, " MB"), 64); err != nil || mb > 64 {
		t.Fatalf("image size %q: want a static binary and certificates, under 64 MB", size)
	}
	if v := b.do("run", "--isolation", "chroot", ctr, "--", "/usr/local/bin/sluice", "version"); !strings.HasPrefix(v, "sluice v0.0.0-image-test") {
		t.Fatalf("sluice version in the image: %q", v)
	}

	// The entrypoint, serving a mounted rule file on a loopback port (the
	// chroot shares the host's network).
	rules := t.TempDir()
	if err := os.WriteFile(filepath.Join(rules, "rules.yaml"), []byte("rules:\n  - id: per-user\n    key: [user]\n    rate: 2\n    per: 1m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(rules, 0o755)
	addr := freeAddr(t)
	serve := b.cmd("run", "--isolation", "chroot", "-v", rules+":/etc/sluice:ro", ctr, "--",
		"/usr/local/bin/sluice", "serve", "--config", "/etc/sluice/rules.yaml", "--listen", addr)
	stdout, _ := serve.StdoutPipe()
	var log strings.Builder // printed only if the test fails
	serve.Stderr = &log
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the served image's log:\n%s", log.String())
		}
	})
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killServe(addr); serve.Process.Kill(); serve.Wait() })
	banner, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.Contains(banner, addr) {
		t.Fatalf("no banner naming %s: %q %v", addr, banner, err)
	}
	if uid := uidListeningOn(t, addr); uid != "65532" {
		t.Fatalf("sluice serves as uid %s, want 65532", uid)
	}
	allowed := 0
	for range 3 {
		resp, err := http.Post("http://"+addr+"/v1/check", "application/json", strings.NewReader(`{"attributes":{"user":"u1"}}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK && strings.HasPrefix(string(body), `{"allowed":true`) {
			allowed++
		}
	}
	if allowed != 2 {
		t.Fatalf("%d of 3 checks allowed by 2 a minute", allowed)
	}
	// The health check the image declares, run in the image.
	hc := b.do("inspect", "--format", "{{index .Docker.Config.Healthcheck.Test 1}} {{index .Docker.Config.Healthcheck.Test 2}}", ctr)
	if hc != "/usr/local/bin/sluice probe" {
		t.Fatalf("health check %q", hc)
	}
	if out := b.do("run", "--isolation", "chroot", ctr, "--", "/usr/local/bin/sluice", "probe", "http://"+addr+"/readyz"); !strings.HasPrefix(out, "ready") {
		t.Fatalf("probe: %q", out)
	}
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// uidListeningOn is the real uid of the process whose command line names
// addr (the serve started in the image).
func uidListeningOn(t *testing.T, addr string) string {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		dirs, _ := filepath.Glob("/proc/[0-9]*")
		for _, d := range dirs {
			cmdline, err := os.ReadFile(d + "/cmdline")
			if err != nil || !strings.HasPrefix(string(cmdline), "/usr/local/bin/sluice\x00serve") || !strings.Contains(string(cmdline), addr) {
				continue
			}
			status, _ := os.ReadFile(d + "/status")
			for _, line := range strings.Split(string(status), "\n") {
				if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
					return f[1]
				}
			}
		}
	}
	t.Fatalf("no process serving %s", addr)
	return ""
}

// killServe ends the serve in the image (buildah run does not pass its
// own kill on to it).
func killServe(addr string) {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		cmdline, _ := os.ReadFile(d + "/cmdline")
		if strings.HasPrefix(string(cmdline), "/usr/local/bin/sluice\x00serve") && strings.Contains(string(cmdline), addr) {
			if pid, err := strconv.Atoi(filepath.Base(d)); err == nil {
				if p, err := os.FindProcess(pid); err == nil {
					p.Kill()
				}
			}
		}
	}
}
