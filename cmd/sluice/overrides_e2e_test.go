package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluice-rl/sluice/internal/testkit/proctest"
)

// The overrides API of the built binary, with its defaults (the embedded
// store), as an attacker or a careless operator would use it: the admin
// guard, huge keys, expiries out of bounds, and 10,001 overrides from 8
// callers at once. Then with --admin-token: no token, a wrong one.
func TestOverridesRefuseHostileInputEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	base, _ := startServe(t, "--config", "../../examples/shop.yaml")
	put := func(base, body string, hdr ...string) (int, string) {
		req, _ := http.NewRequest("PUT", base+"/v1/overrides", strings.NewReader(body))
		for i := 0; i+1 < len(hdr); i += 2 {
			if hdr[i] == "Host" {
				req.Host = hdr[i+1]
			} else {
				req.Header.Set(hdr[i], hdr[i+1])
			}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	one := func(user, extra string) string {
		return fmt.Sprintf(`{"rule":"user-default","keyValues":{"user":%q},"action":"exempt","reason":"r","by":"b"%s}`, user, extra)
	}
	for _, c := range []struct {
		body string
		hdr  []string
		want int
	}{
		{one("u", `,"for":"1h"`), []string{"Host", "attacker.example"}, 403},
		{one("u", `,"for":"1h"`), []string{"Origin", "http://attacker.example"}, 403},
		{one("u", `,"expires":"2001-01-01T00:00:00Z"`), nil, 400},
		{one("u", `,"expires":"2999-01-01T00:00:00Z"`), nil, 400},
		{one("u", `,"for":"100000h"`), nil, 400},
		{one("u", ``), nil, 400},
		{one("u", `,"for":"1h","rate":5`), nil, 400},
		{`{"rule":"user-default","prefix":"` + strings.Repeat("k", 5000) + `","action":"block","for":"1h","reason":"r","by":"b"}`, nil, 400},
		// A long key is counted, and overridden, as its digest.
		{`{"rule":"user-default","key":"` + strings.Repeat("k", 5000) + `","action":"block","for":"1h","reason":"r","by":"b"}`, nil, 201},
		{one(strings.Repeat("v", 500_000), `,"for":"1h"`), nil, 201},
		// A key is built as the rule builds it: an IPv6 address as its
		// /64; what the rule could never build is refused.
		{`{"rule":"ip-flood","key":"2001:db8:1:2::5","action":"block","for":"1h","reason":"r","by":"b"}`, nil, 201},
		{`{"rule":"ip-flood","key":"not-an-address","action":"block","for":"1h","reason":"r","by":"b"}`, nil, 400},
		{`{"rule":"login","key":"u1","action":"block","for":"1h","reason":"r","by":"b"}`, nil, 400},
		{`{"rule":"user-default","key":"u1","action":"limit","rate":5,"per":"-1m","for":"1h","reason":"r","by":"b"}`, nil, 400},
	} {
		if code, body := put(base, c.body, c.hdr...); code != c.want {
			t.Errorf("%.100s %v: %d %.300s, want %d", c.body, c.hdr, code, body, c.want)
		}
	}

	var created, full, other atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := next.Add(1); i <= 10_001; i = next.Add(1) {
				b, _ := json.Marshal(map[string]any{"rule": "user-default", "key": fmt.Sprint("user-", i), "action": "block", "for": "1h", "reason": "flood", "by": "t"})
				req, _ := http.NewRequest("PUT", base+"/v1/overrides", bytes.NewReader(b))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusCreated:
					created.Add(1)
				case http.StatusConflict:
					full.Add(1)
				default:
					other.Add(1)
				}
			}
		})
	}
	wg.Wait()
	// Three were created above (the long keys, the address): 9,997 more fit.
	if created.Load() != 9_997 || full.Load() != 4 || other.Load() != 0 {
		t.Fatalf("10,001 overrides more: %d created, %d refused as past the bound, %d otherwise; want 9,997, 4, 0", created.Load(), full.Load(), other.Load())
	}
	// The command names its own flag at fault, not the API's field.
	if code, stderr := proctest.Run(t, "override", "set", "--url", base, "--rule", "user-default", "--key-value", "user=u", "--action", "limit", "--rate", "5", "--per", "-1m", "--for", "1h", "--reason", "r"); code == 0 || !strings.Contains(stderr, "(--per)") {
		t.Errorf("a negative --per: exit %d, %s; want the flag named", code, stderr)
	}
	if code, body := put(base, one("u", `,"for":"1h"`)); code != http.StatusConflict || !strings.Contains(body, "at most 10000") {
		t.Fatalf("at the bound: %d %s", code, body)
	}

	tokened, _ := startServe(t, "--config", "../../examples/shop.yaml", "--admin-token", "s3cret")
	for _, c := range []struct {
		hdr  []string
		want int
	}{{nil, 401}, {[]string{"Authorization", "Bearer wrong"}, 401}, {[]string{"Authorization", "Bearer s3cret", "Host", "sluice.example"}, 201}} {
		if code, body := put(tokened, one("u", `,"for":"1h"`), c.hdr...); code != c.want {
			t.Errorf("with --admin-token, %v: %d %s, want %d", c.hdr, code, body, c.want)
		}
	}
}

// The gateway follows overrides too: set through its admin listener with
// the command, a block refuses the key at the proxy and an exemption lets
// it past its limit, with the defaults (the fasthttp plane, the embedded
// store).
func TestTheGatewayEnforcesOverridesEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte("rules:\n  - {id: per-user, key: [user], rate: 2, per: 1h}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	admin := freeAddr(t)
	base, _ := start(t, "gateway", "--config", rulesPath, "--upstream", up.URL, "--listen", "127.0.0.1:0", "--admin-listen", admin, "--watch", "0")
	get := func(user string) int {
		req, _ := http.NewRequest("GET", base+"/", nil)
		req.Header.Set("X-User-ID", user)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	run := func(args ...string) {
		t.Helper()
		if code, stderr := proctest.Run(t, append([]string{"override", "set", "--url", "http://" + admin}, args...)...); code != 0 {
			t.Fatalf("sluice override set %v: exit %d: %s", args, code, stderr)
		}
	}
	run("--rule", "per-user", "--key-value", "user=bad", "--action", "block", "--for", "1h", "--reason", "abuse")
	run("--rule", "per-user", "--key-value", "user=vip", "--action", "exempt", "--for", "1h", "--reason", "partner")
	if code := get("bad"); code != http.StatusTooManyRequests {
		t.Fatalf("a blocked user at the gateway: %d, want 429", code)
	}
	for i := range 5 {
		if code := get("vip"); code != http.StatusOK {
			t.Fatalf("an exempt user's request %d at the gateway: %d", i+1, code)
		}
	}
	codes := []int{get("other"), get("other"), get("other")}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != http.StatusTooManyRequests {
		t.Fatalf("a user without an override: %v, want the rule's 2 then 429", codes)
	}
}
