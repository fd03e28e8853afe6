package main

import (
	"testing"

	"github.com/sluice-rl/sluice/rules"
)

// The share layer passes calls straight to the store only while every rule
// is exact, unsharded and whole in this gateway's region; the table says
// so for each rule set, and says it again when the rule set changes.
func TestTheSharingTableSaysWhenEveryRuleIsExact(t *testing.T) {
	table := &sharingTable{region: "eu"}
	for _, c := range []struct {
		rule string
		want bool
	}{
		{"{id: a, key: [ip], rate: 5, per: 1s}", true},
		{"{id: a, key: [ip], rate: 5, per: 1s, sync: exact}", true},
		{"{id: a, key: [ip], rate: 5, per: 1s, sync: lease}", false},
		{"{id: a, key: [ip], rate: 5, per: 1s, sync: local}", false},
		{"{id: a, key: [ip], rate: 5, per: 1s, sync: auto}", false},
		{"{id: a, key: [ip], rate: 5000, per: 1s, sync: {mode: exact, shards: 8}}", false},
		{"{id: a, key: [ip], rate: 5, per: 1s, regions: {eu: 50%, us: 50%}}", false},
	} {
		src := "rules:\n  - {id: plain, key: [ip], rate: 1, per: 1s}\n  - " + c.rule + "\n"
		cfg, err := rules.Parse("s.yaml", []byte(src))
		if err != nil {
			t.Fatalf("%s: %v", c.rule, err)
		}
		if got := table.get(cfg).allExact; got != c.want {
			t.Errorf("%s: all exact %v, want %v", c.rule, got, c.want)
		}
	}
}
