package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-rl/sluice/store/redis/redistest"
)

func postJSON(t *testing.T, url, body string, v any) int {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return 0
	}
	defer resp.Body.Close()
	json.NewDecoder(resp.Body).Decode(v)
	return resp.StatusCode
}

type settleAnswer struct {
	Settled []struct {
		Rule      string
		Settled   bool
		Reason    string
		Remaining int64
	}
	Field string
}

// Two `sluice serve` processes with their default flags on one Redis:
// sixty-four clients at once each reserve on one and settle on the other,
// then try again and try an id they edited. Each reservation settles
// exactly once, the count is exact to the unit, edited and malformed ids
// settle nothing, and an absurd actual is a debt, not a store failure.
func TestReservationsSettleOnceAcrossTwoServeProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	srv := redistest.Start(t)
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rulesPath, []byte(`rules:
  - {id: tokens, key: [api_key], rate: 1000000, per: 1d, algorithm: fixed-window, reserve: {estimate: 100}}
  - {id: other, key: [user], rate: 10, per: 1h, onMissingKey: skip}
`), 0o600)
	a, _ := start(t, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--config", rulesPath, "--store", srv.URL())
	b, _ := start(t, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--config", rulesPath, "--store", srv.URL())
	const clients = 64
	var wg sync.WaitGroup
	var mu sync.Mutex
	settled, again, forged := 0, 0, 0
	var actuals int64
	for i := range clients {
		wg.Go(func() {
			reserveOn, settleOn := a, b
			if i%2 == 1 {
				reserveOn, settleOn = b, a
			}
			var res struct {
				Allowed bool
				ID      string
			}
			if code := postJSON(t, reserveOn+"/v1/reserve", `{"attributes":{"api_key":"sk-shared"},"estimate":500}`, &res); code != 200 || !res.Allowed || res.ID == "" {
				t.Errorf("reserve: %d %+v", code, res)
				return
			}
			var s1, s2, s3 settleAnswer
			postJSON(t, settleOn+"/v1/settle", fmt.Sprintf(`{"id":%q,"actual":%d}`, res.ID, i), &s1)
			postJSON(t, reserveOn+"/v1/settle", fmt.Sprintf(`{"id":%q,"actual":0}`, res.ID), &s2)
			// The same id with its random part changed: a guess at another
			// reservation of the same key.
			edited := []byte(res.ID)
			edited[3] ^= 1
			code := postJSON(t, settleOn+"/v1/settle", fmt.Sprintf(`{"id":%q,"cancel":true}`, edited), &s3)
			mu.Lock()
			defer mu.Unlock()
			if len(s1.Settled) == 1 && s1.Settled[0].Settled {
				settled++
				actuals += int64(i)
			}
			if len(s2.Settled) == 1 && s2.Settled[0].Settled {
				again++
			}
			if code == 200 && len(s3.Settled) == 1 && s3.Settled[0].Settled {
				forged++
			}
		})
	}
	wg.Wait()
	if settled != clients || again != 0 || forged != 0 {
		t.Fatalf("%d of %d settled, %d settled twice, %d edited ids settled", settled, clients, again, forged)
	}
	var state struct {
		Statuses []struct {
			Rule      string
			Remaining int64
		}
	}
	// A dry run reports what would be left after it: one unit less.
	postJSON(t, a+"/v1/check", `{"attributes":{"api_key":"sk-shared"},"dryRun":true,"estimate":1}`, &state)
	if len(state.Statuses) == 0 || state.Statuses[0].Remaining != 1000000-actuals-1 {
		t.Fatalf("after %d settles totalling %d: %+v, want %d left", clients, actuals, state.Statuses, 1000000-actuals)
	}

	// Malformed ids are 400 problems naming the field.
	for _, body := range []string{`{"id":"%%%","actual":1}`, `{"id":"` + strings.Repeat("Q", 10000) + `","actual":1}`, `{"id":"AQID","actual":1}`} {
		var p settleAnswer
		if code := postJSON(t, b+"/v1/settle", body, &p); code != 400 || p.Field != "id" {
			t.Errorf("%.30s: %d field %q, want 400 naming id", body, code, p.Field)
		}
	}
	// An absurd actual puts the key in debt; the store answers on.
	var res struct{ ID string }
	postJSON(t, a+"/v1/reserve", `{"attributes":{"api_key":"sk-greedy"}}`, &res)
	var s settleAnswer
	if code := postJSON(t, b+"/v1/settle", fmt.Sprintf(`{"id":%q,"actual":9223372036854775807}`, res.ID), &s); code != 200 || !s.Settled[0].Settled {
		t.Fatalf("a huge actual: %d %+v", code, s)
	}
	var chk struct {
		Allowed  bool
		Degraded bool
	}
	postJSON(t, a+"/v1/check", `{"attributes":{"api_key":"sk-greedy"}}`, &chk)
	if chk.Allowed || chk.Degraded {
		t.Fatalf("the key in debt: %+v, want refused by the store", chk)
	}
	postJSON(t, b+"/v1/check", `{"attributes":{"user":"u1"}}`, &chk)
	if !chk.Allowed || chk.Degraded {
		t.Fatalf("another key after the huge settle: %+v, want allowed, not degraded", chk)
	}
}
