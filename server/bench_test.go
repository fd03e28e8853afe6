package server

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/internal/testkit/benchtest"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

// BenchmarkCheckAPI measures POST /v1/check over loopback HTTP with
// keep-alive clients in parallel: decisions per second and p99.
func BenchmarkCheckAPI(b *testing.B) {
	cfg, _ := rules.Parse("b.yaml", []byte("rules:\n  - {id: per-user, key: [user], rate: 1000000000, per: 1s}\n  - {id: per-ip, key: [ip], rate: 1000000000, per: 1s}\n"))
	e, _ := engine.New(cfg, engine.Options{Store: memory.New(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	srv, _ := New(Options{Engine: e, Loopback: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	front := httptest.NewServer(srv)
	defer front.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	body := `{"request":{"method":"GET","path":"/items","ip":"203.0.113.7"},"attributes":{"user":"u42"}}`
	benchtest.Parallel(b, func() error {
		resp, err := client.Post(front.URL+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	})
}
