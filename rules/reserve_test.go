package rules

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestReserveSectionLoads(t *testing.T) {
	c, err := Parse("r.yaml", []byte(`rules:
  - id: tpm
    key: [header:X-API-Key]
    rate: 10000
    per: 1m
    reserve: {estimate: 500, estimateHeader: x-max-tokens, actualJSON: usage.total_tokens, deadline: 2m}
  - id: bytes
    key: [ip]
    rate: 1000000
    per: 1h
    reserve: {estimate: 1000, estimateBody: size, actualHeader: X-Bytes-Sent}
`))
	if err != nil {
		t.Fatal(err)
	}
	rv := c.Rules[0].Reserve
	if rv == nil || rv.Estimate != 500 || rv.EstimateHeader != "X-Max-Tokens" || !slices.Equal(rv.ActualJSON, []string{"usage", "total_tokens"}) || rv.Deadline != 2*time.Minute {
		t.Fatalf("reserve = %+v", rv)
	}
	if rv := c.Rules[1].Reserve; rv.ActualHeader != "X-Bytes-Sent" || rv.EstimateBody != "size" || rv.Deadline != DefaultReserveDeadline {
		t.Fatalf("reserve = %+v", rv)
	}
	if !c.NeedsBody() || !c.ReadsHeader("X-Max-Tokens") || !c.SettlesFromJSON() || !c.SettlesFromResponses() {
		t.Errorf("NeedsBody %v, ReadsHeader %v, SettlesFromJSON %v", c.NeedsBody(), c.ReadsHeader("X-Max-Tokens"), c.SettlesFromJSON())
	}
	for body, want := range map[string]int64{`{"size": 77}`: 77, `{"size": "78"}`: 78, `size=79`: 79, `{"size": -1}`: 0, `{"size": 1.5}`: 0, `{}`: 0} {
		ct := "application/json"
		if body[0] != '{' {
			ct = "application/x-www-form-urlencoded"
		}
		n, _ := BodyNumber(&Request{Body: []byte(body), Header: map[string][]string{"Content-Type": {ct}}}, "size")
		if n != want && !(want == 0) {
			t.Errorf("BodyNumber(%s) = %d, want %d", body, n, want)
		}
		if _, ok := BodyNumber(&Request{Body: []byte(body), Header: map[string][]string{"Content-Type": {ct}}}, "size"); ok != (want > 0) {
			t.Errorf("BodyNumber(%s) ok = %v", body, ok)
		}
	}
	if d := c.Rules[0].Summary(); !strings.Contains(d, "reserves 500 up front") || !strings.Contains(d, "usage.total_tokens") {
		t.Errorf("Summary = %q", d)
	}
}

func TestBadReserveSectionsAreRefusedByField(t *testing.T) {
	for body, want := range map[string]string{
		"reserve: {actualHeader: X-Used}":                            "rules[0].reserve.estimate: missing",
		"reserve: {estimate: 0}":                                     "rules[0].reserve.estimate: must be > 0",
		"reserve: {estimate: 20000}":                                 "rules[0].reserve.estimate: estimate 20000 is more than the burst 10000",
		"reserve: {estimate: 5, actualHeader: X-A, actualJSON: a.b}": "rules[0].reserve: give actualHeader or actualJSON, not both",
		"reserve: {estimate: 5, actualJSON: usage..total}":           "rules[0].reserve.actualJSON: want a dotted path",
		"reserve: {estimate: 5, actualHeader: \"X Used\"}":           "rules[0].reserve.actualHeader: \"X Used\" is not an HTTP header name",
		"reserve: {estimate: 5, deadline: 2d}":                       "rules[0].reserve.deadline: at most 24h0m0s",
		"reserve: {estimate: 5, colour: red}":                        "rules[0].reserve.colour: unknown field",
		"reserve: {estimate: 5}, countOn: {status: [401]}":           "rules[0].reserve: a rule counts either on a status",
		"reserve: {estimate: 5}, mode: shadow":                       "rules[0].reserve: shadow rules count nothing to settle",
		"reserve: {estimate: 5}, sync: {mode: exact, shards: 4}":     "rules[0].reserve: a reservation is settled on the key it was taken from",
	} {
		_, err := Parse("r.yaml", []byte("rules:\n  - {id: a, key: [ip], rate: 10000, per: 1m, "+body+"}\n"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", body, err, want)
		}
	}
}
