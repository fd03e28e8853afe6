package rules_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/rules"
)

// A global rule loads with its regions' own shares in thousandths and the
// defaults, and each setting that cannot hold is refused with its line,
// its field and the reason.
func TestGlobalRulesLoadOrSayWhy(t *testing.T) {
	cfg, err := rules.Parse("g.yaml", []byte(`
rules:
  - {id: g, key: [user], rate: 100, per: 1s, algorithm: token-bucket, global: {regions: {eu: 34%, us: 33.3%, ap: 0.1%}, borrow: 2%}}
`))
	if err != nil {
		t.Fatal(err)
	}
	g := cfg.Rules[0].Global
	if g == nil || g.Own["eu"] != 340 || g.Own["us"] != 333 || g.Own["ap"] != 1 || g.Borrow != 20 || g.Period != time.Second || g.Lease != 3*time.Second {
		t.Fatalf("loaded %+v", g)
	}
	for _, c := range []struct{ rule, want string }{
		{`algorithm: gcra, global: {regions: {eu: 50%}}`, "rules[0].global: a global limit is a token-bucket"},
		{`algorithm: token-bucket, sync: lease, global: {regions: {eu: 50%}}`, "decides exactly in each region"},
		{`algorithm: token-bucket, regions: {eu: 50%}, global: {regions: {eu: 50%}}`, "regions and global both divide"},
		{`algorithm: token-bucket, global: {regions: {eu: 60%, us: 50%}}`, "add up to 110%"},
		{`algorithm: token-bucket, global: {regions: {eu: 33.35%, us: 33.35%, ap: 33.3%}}`, "add up to 100.1% once each is counted in tenths"},
		{`algorithm: token-bucket, global: {regions: {eu: 0.04%}}`, "at least 0.1%"},
		{`algorithm: token-bucket, global: {regions: {eu: 50%}, period: 2s, lease: 3s}`, "shorter than two periods"},
		{`algorithm: token-bucket, global: {regions: {eu: 50%}, borrow: 20%}`, "between 0% and 10%"},
		{`algorithm: token-bucket, global: {period: 1s}`, "global.regions: missing"},
		{`algorithm: token-bucket, global: {regions: {"e|u": 50%}}`, "a region name is"},
		{`algorithm: token-bucket, global: {regions: {eu: 50%}, shares: 1}`, `unknown field "shares"`},
	} {
		_, err := rules.Parse("g.yaml", []byte("rules:\n  - {id: g, key: [user], rate: 100, per: 1s, "+c.rule+"}\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "g.yaml:2:") {
			t.Errorf("%s: got %v, want g.yaml:2:... %q", c.rule, err, c.want)
		}
	}
}
