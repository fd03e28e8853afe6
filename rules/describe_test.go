package rules

import (
	"strings"
	"testing"
)

// A rule's summary (what `sluice check`, /v1/rules and the live page show)
// names every condition the rule enforces: values it matches, exemptions,
// overrides (as their own rules, with their values), tiers by name,
// adaptive, reservations' deadlines and penalties as amounts, and what a
// sync mode costs in a flood. A hashed source's values (secrets) are only
// counted.
func TestSummaryNamesEveryCondition(t *testing.T) {
	src := `keys:
  plan: {header: X-Plan}
  api_key: {header: Authorization, scheme: Bearer, hash: true}
priority:
  levels: [gold, silver, bronze]
  from: header:X-Tier
rules:
  - {id: plans, match: {values: {plan: [gold, silver]}}, key: [user], rate: 100, per: 1m, exempt: {ip: [10.0.0.0/8]}}
  - {id: keys, key: [api_key], rate: 10, per: 1m, overrides: [{values: {api_key: [sk-secret]}, rate: 1000}]}
  - {id: tiered, key: [ip], rate: 100, per: 1m, tiers: {gold: 20%, silver: 30%}}
  - {id: adapt, key: [ip], rate: 100, per: 1m, adaptive: true}
  - {id: llm, key: [ip], rate: 100, per: 1m, reserve: {estimate: 10, actualHeader: X-Used, deadline: 1s}}
  - {id: pen, key: [ip], rate: 5, per: 1m, penalty: {after: 3, block: 1m}}
  - {id: synced, key: [ip], rate: 100, per: 1m, sync: sync}
`
	cfg, err := Parse("s.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"plans: with plan gold|silver except ip 10.0.0.0/8, per user (without it: per ip): at most 100 at once, then 100 per minute (gcra)",
		"keys: every request except api_key in 1 listed values, per api_key (without it: per ip): at most 10 at once, then 10 per minute (gcra)",
		"keys.key-limit-1: with api_key in 1 listed values, per api_key (without it: per ip): at most 1000 at once, then 1000 per minute (gcra)",
		"tiered: every request, per ip: at most 100 at once, then 100 per minute; tiers: keeps 20% for gold, 30% for silver and above (bronze may use 50%) (gcra)",
		"adapt: every request, per ip: at most 100 at once, then 100 per minute; adaptive: admits less while the protected service is under pressure (gcra)",
		"llm: every request, per ip: at most 100 at once, then 100 per minute; reserves 10 up front and settles at the real cost (response header X-Used) within 1 second (gcra)",
		"pen: every request, per ip: at most 5 at once, then 5 per minute; locked for 1 minute after 3 rejections (gcra)",
		"synced: every request, per ip: at most 100 at once, then 100 per minute; shared by sync (local counts flushed every 100ms; may pass the limit by about rate x 100ms x (gateways - 1) in steady traffic, and in a flood by up to what each gateway admits between flushes, up to the limit on each: 1,867 of 1,000 measured with 3 gateways) (gcra)",
	}
	var got []string
	for _, r := range cfg.Rules {
		got = append(got, r.Summary())
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("summaries:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, s := range got {
		if strings.Contains(s, "sk-secret") {
			t.Fatalf("a hashed source's value is shown: %s", s)
		}
	}
}
