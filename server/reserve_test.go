package server

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/httplimit"
)

const reserveTestRules = `
rules:
  - {id: tpm, key: [header:X-API-Key], rate: 1000, per: 1m, reserve: {estimate: 100, deadline: 30s}}
  - {id: rpm, key: [header:X-API-Key], rate: 60, per: 1m}
`

func TestReserveAndSettleOverTheAPI(t *testing.T) {
	f := newFixtureOf(t, reserveTestRules, Options{Loopback: true})
	body := `{"request":{"headers":{"X-API-Key":"k1"}},"estimate":400}`
	w := f.do("POST", "/v1/reserve", body)
	var resp CheckResponse
	if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil || w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	deadline, err := time.Parse(time.RFC3339Nano, resp.Deadline)
	if !resp.Allowed || resp.ID == "" || err != nil || deadline.Before(time.Now().Add(29*time.Second)) {
		t.Fatalf("reserve: %+v (%v)", resp, err)
	}
	if st := resp.Statuses[0]; st.Rule != "tpm" || st.Remaining != 600 {
		t.Fatalf("reserved 400: %+v", st)
	}
	w = f.do("POST", "/v1/settle", fmt.Sprintf(`{"id":%q,"actual":250}`, resp.ID))
	var set SettleResponse
	if err := json.Unmarshal(w.Body.Bytes(), &set); err != nil || w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if len(set.Settled) != 1 || !set.Settled[0].Settled || set.Settled[0].Rule != "tpm" || set.Settled[0].Remaining != 750 || set.Settled[0].Reason != "settled" {
		t.Fatalf("settle at 250: %+v", set)
	}
	w = f.do("POST", "/v1/settle", fmt.Sprintf(`{"id":%q,"cancel":true}`, resp.ID))
	json.Unmarshal(w.Body.Bytes(), &set)
	if set.Settled[0].Settled || set.Settled[0].Reason != "no-reservation" {
		t.Fatalf("a second settle: %+v", set)
	}
	// /v1/check takes an estimate for good, and opens nothing.
	w = f.do("POST", "/v1/check", `{"request":{"headers":{"X-API-Key":"k1"}},"estimate":50}`)
	resp = CheckResponse{}
	json.Unmarshal(w.Body.Bytes(), &resp)
	if resp.ID != "" || resp.Statuses[0].Remaining != 700 {
		t.Fatalf("a check with an estimate: %+v", resp)
	}
	// Cancel gives the whole estimate back.
	w = f.do("POST", "/v1/reserve", `{"request":{"headers":{"X-API-Key":"k2"}}}`)
	json.Unmarshal(w.Body.Bytes(), &resp)
	w = f.do("POST", "/v1/settle", fmt.Sprintf(`{"id":%q,"cancel":true}`, resp.ID))
	json.Unmarshal(w.Body.Bytes(), &set)
	if !set.Settled[0].Settled || set.Settled[0].Remaining != 1000 {
		t.Fatalf("cancel: %+v", set)
	}
}

func TestBadSettlesAre400ProblemsNamingTheField(t *testing.T) {
	f := newFixtureOf(t, reserveTestRules, Options{Loopback: true})
	for body, field := range map[string]string{
		`{"actual":5}`:                        "id",
		`{"id":"x"}`:                          "actual",
		`{"id":"x","actual":-1}`:              "actual",
		`{"id":"x","actual":1,"cancel":true}`: "cancel",
		`{"id":"not-an-id","actual":1}`:       "id",
		`{"id":"AQ","actual":1}`:              "id",
		`{"id":"x","actual":1e30}`:            "actual",
		`{"id":"x","actual":1,"extra":1}`:     "extra",
		`{"id":` + `"` + strings.Repeat("A", 5000) + `","actual":1}`: "id",
	} {
		w := f.do("POST", "/v1/settle", body)
		var p httplimit.Problem
		json.Unmarshal(w.Body.Bytes(), &p)
		if w.Code != 400 || p.Field != field || w.Header().Get("Content-Type") != "application/problem+json" {
			t.Errorf("%.60s: %d field %q (%s), want 400 naming %q", body, w.Code, p.Field, p.Detail, field)
		}
	}
	for body, field := range map[string]string{
		`{"estimate":0}`:              "estimate",
		`{"estimate":-5}`:             "estimate",
		`{"estimate":"many"}`:         "estimate",
		`{"dryRun":true}`:             "dryRun",
		`{"estimate":1,"status":200}`: "status",
	} {
		w := f.do("POST", "/v1/reserve", body)
		var p httplimit.Problem
		json.Unmarshal(w.Body.Bytes(), &p)
		if w.Code != 400 || p.Field != field {
			t.Errorf("reserve %s: %d field %q (%s), want 400 naming %q", body, w.Code, p.Field, p.Detail, field)
		}
	}
	// An estimate beyond the burst is refused as no waiting could admit it.
	w := f.do("POST", "/v1/reserve", `{"request":{"headers":{"X-API-Key":"k"}},"estimate":9223372036854775807}`)
	var resp CheckResponse
	json.Unmarshal(w.Body.Bytes(), &resp)
	if w.Code != 200 || resp.Allowed || resp.Reason != "cost-exceeds-limit" || resp.ID != "" {
		t.Fatalf("a huge estimate: %d %s", w.Code, w.Body)
	}
}
