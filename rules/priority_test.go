package rules

import (
	"net/http"
	"strings"
	"testing"
)

func TestPriorityAndTiersLoad(t *testing.T) {
	c, err := Parse("r.yaml", []byte(`
priority:
  from: header:X-Priority
  routes: {"/checkout/*": critical, "/recommendations/*": sheddable}
rules:
  - {id: api, key: [ip], rate: 1000, per: 1s, tiers: {critical: 20%, default: 30%}}
`))
	if err != nil {
		t.Fatal(err)
	}
	p := c.Priority
	for _, c := range []struct {
		path, header string
		want         int
	}{
		{"/checkout/pay", "sheddable", 0}, // the route wins
		{"/recommendations/x", "", 2},     //
		{"/items", "CRITICAL", 0},         // the header, any case
		{"/items", "", 1},                 // no value: default
		{"/items", "urgent!!", 1},         // not a level: default
	} {
		req := &Request{Path: c.path, Header: http.Header{}}
		if c.header != "" {
			req.Header.Set("X-Priority", c.header)
		}
		if got := p.Level(req); got != c.want {
			t.Errorf("%s with X-Priority %q: level %d, want %d", c.path, c.header, got, c.want)
		}
	}
	tiers := c.Rules[0].Tiers
	for level, want := range []int64{0, 200, 500} {
		if got := tiers.Floor(level, 1000); got != want {
			t.Errorf("floor of level %d: %d, want %d", level, got, want)
		}
	}
	if !c.ReadsHeader("X-Priority") {
		t.Error("the priority header is not read by proxies")
	}
}

func TestBadPrioritiesAreRefusedByField(t *testing.T) {
	for src, want := range map[string]string{
		"rules:\n  - {id: a, key: [ip], rate: 10, per: 1s, tiers: {critical: 20%}}\n":                                                        "rules[0].tiers: tiers need a priority section",
		"priority: {from: header:X-P}\nrules:\n  - {id: a, key: [ip], rate: 10, per: 1s, tiers: {urgent: 20%}}\n":                            "rules[0].tiers.urgent: \"urgent\" is not one of the levels",
		"priority: {from: header:X-P}\nrules:\n  - {id: a, key: [ip], rate: 10, per: 1s, tiers: {critical: 80%, default: 30%}}\n":            "rules[0].tiers: the shares add up to 110%",
		"priority: {}\nrules:\n  - {id: a, key: [ip], rate: 10, per: 1s}\n":                                                                  "priority: say where a request's tier comes from",
		"priority: {from: nobody}\nrules:\n  - {id: a, key: [ip], rate: 10, per: 1s}\n":                                                      "priority.from: unknown key source",
		"priority: {from: header:X-P, levels: [gold]}\nrules:\n  - {id: a, key: [ip], rate: 10, per: 1s}\n":                                  "priority.levels: name 2 to 8 levels",
		"priority: {from: header:X-P, default: bronze}\nrules:\n  - {id: a, key: [ip], rate: 10, per: 1s}\n":                                 "priority.default: \"bronze\" is not one of the levels",
		"priority: {routes: {\"checkout\": critical}}\nrules:\n  - {id: a, key: [ip], rate: 10, per: 1s}\n":                                  "priority.routes.checkout: path pattern",
		"priority: {from: header:X-P}\nrules:\n  - {id: a, key: [ip], rate: 10, per: 1s, tiers: {critical: 20%}, mode: shadow, colour: 1}\n": "rules[0].colour: unknown field",
	} {
		_, err := Parse("r.yaml", []byte(src))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", src, err, want)
		}
	}
}
