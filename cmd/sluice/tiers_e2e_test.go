package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func put(t *testing.T, url, body string, v any) int {
	t.Helper()
	req, _ := http.NewRequest("PUT", url, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if v != nil {
		decodeInto(resp, v)
	}
	return resp.StatusCode
}

// `sluice serve` with its defaults and a rule file with tiers and an
// adaptive rule: an operator's pressure factor (PUT /v1/pressure) shrinks
// the adaptive rule, the lowest tier first, and the answers advertise the
// reduced quota; bad factors are 400 problems naming the field.
func TestServeTiersAndAnOperatorsPressure(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rulesPath, []byte(`priority: {from: header:X-Priority}
rules:
  - {id: api, key: [tenant], rate: 10, per: 1h, adaptive: true, tiers: {critical: 50%}}
`), 0o600)
	base, _ := startServe(t, "--config", rulesPath)
	check := func(tenant, tier string) (bool, string) {
		var res struct {
			Allowed bool
			Headers map[string]string
		}
		postJSON(t, base+"/v1/check", fmt.Sprintf(`{"request":{"headers":{"X-Tenant-ID":%q,"X-Priority":%q}}}`, tenant, tier), &res)
		return res.Allowed, res.Headers["RateLimit-Policy"]
	}
	count := func(tenant, tier string) (n int, policy string) {
		for range 20 {
			ok, p := check(tenant, tier)
			if ok {
				n++
			}
			policy = p
		}
		return n, policy
	}
	// Healthy: default takes its 5, critical the other 5.
	if d, _ := count("t1", "default"); d != 5 {
		t.Fatalf("healthy: default took %d of 10, want 5", d)
	}
	if c, _ := count("t1", "critical"); c != 5 {
		t.Fatalf("healthy: critical took %d, want 5", c)
	}
	var p struct {
		Factor float64
		Set    *float64
	}
	if code := put(t, base+"/v1/pressure", `{"factor":0.5,"forSeconds":600}`, &p); code != 200 || p.Factor != 0.5 || p.Set == nil {
		t.Fatalf("PUT /v1/pressure: %d %+v", code, p)
	}
	// At half rate, critical keeps its 5 requests; default gets nothing.
	d, _ := count("t2", "default")
	c, policy := count("t2", "critical")
	if d != 0 || c != 5 || !strings.Contains(policy, `"api";q=5;`) {
		t.Fatalf("factor 0.5: default %d, critical %d, policy %q; want 0, 5 and q=5", d, c, policy)
	}
	for body, field := range map[string]string{
		`{"factor":0}`: "factor", `{"factor":1.5}`: "factor", `{"factor":"half"}`: "factor", `{}`: "factor",
		`{"factor":0.5,"forSeconds":0}`: "forSeconds", `{"factor":0.5,"forSeconds":999999}`: "forSeconds",
	} {
		var prob struct{ Field string }
		if code := put(t, base+"/v1/pressure", body, &prob); code != 400 || prob.Field != field {
			t.Errorf("PUT %s: %d field %q, want 400 naming %q", body, code, prob.Field, field)
		}
	}
	var cleared struct {
		Factor float64
		Set    *float64
	}
	if code := put(t, base+"/v1/pressure", `{"factor":1}`, &cleared); code != 200 || cleared.Factor != 1 || cleared.Set != nil {
		t.Fatalf("clearing the factor: %d %+v", code, cleared)
	}
}

func decodeInto(resp *http.Response, v any) { json.NewDecoder(resp.Body).Decode(v) }
