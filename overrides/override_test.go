package overrides

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

var now = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

func valid() Override {
	return Override{Rule: "r", Key: "k", Action: Limit, Rate: 5, Per: Duration(time.Minute), Expires: now.Add(time.Hour), Reason: "why", By: "who"}
}

// Every field at fault is named, and the first one found is the one said.
func TestCheckNamesTheFieldAtFault(t *testing.T) {
	for _, c := range []struct {
		field string
		edit  func(*Override)
	}{
		{"rule", func(o *Override) { o.Rule = "" }},
		{"key", func(o *Override) { o.Key = "" }},
		{"prefix", func(o *Override) { o.Prefix = "p" }},
		{"key", func(o *Override) { o.Key = strings.Repeat("k", MaxKeyBytes+1) }},
		{"rate", func(o *Override) { o.Rate = 0 }},
		{"per", func(o *Override) { o.Per = 0 }},
		{"per", func(o *Override) { o.Per = Duration(-time.Minute) }},
		{"burst", func(o *Override) { o.Burst = -1 }},
		{"rate", func(o *Override) { o.Action = Exempt }},
		{"action", func(o *Override) { o.Action = "" }},
		{"action", func(o *Override) { o.Action = "BLOCK" }},
		{"expires", func(o *Override) { o.Expires = time.Time{} }},
		{"expires", func(o *Override) { o.UntilRemoved = true }},
		{"expires", func(o *Override) { o.Expires = now }},
		{"expires", func(o *Override) { o.Expires = now.Add(-time.Hour) }},
		{"expires", func(o *Override) { o.Expires = now.Add(MaxLifetime + time.Second) }},
		{"reason", func(o *Override) { o.Reason = "" }},
		{"reason", func(o *Override) { o.Reason = "\xff" }},
		{"reason", func(o *Override) { o.Reason = strings.Repeat("r", MaxTextBytes+1) }},
		{"by", func(o *Override) { o.By = "" }},
	} {
		o := valid()
		c.edit(&o)
		var fe *FieldError
		if err := o.Check(now); !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%+v: %v, want an error naming %s", o, err, c.field)
		} else if o.Per < 0 && strings.Contains(fe.Problem, "missing") {
			t.Errorf("a negative period is said missing: %v", fe)
		}
	}
	o := valid()
	if err := o.Check(now); err != nil {
		t.Fatal(err)
	}
	o.Expires, o.UntilRemoved = time.Time{}, true
	if err := o.Check(now); err != nil {
		t.Fatalf("until removed: %v", err)
	}
}

// Put and Delete are compare-and-set on the override's version: a
// writer who read an old version loses, and nothing changes.
func TestTwoOperatorsCannotOverwriteEachOtherBlindly(t *testing.T) {
	ctx := context.Background()
	var m Memory
	first, before, err := m.Put(ctx, valid(), 0, now)
	if err != nil || before != nil || first.Version != 1 || first.ID != IDOf("r", "k", "") {
		t.Fatalf("create: %+v %+v %v", first, before, err)
	}
	if _, _, err := m.Put(ctx, valid(), 0, now); !errors.Is(err, ErrVersion) {
		t.Fatalf("create over an existing one: %v, want ErrVersion", err)
	}
	second := valid()
	second.Rate = 7
	w, before, err := m.Put(ctx, second, first.Version, now)
	if err != nil || before.Rate != 5 || w.Version != 2 {
		t.Fatalf("replace at its version: %+v %+v %v", w, before, err)
	}
	third := valid()
	third.Rate = 9
	if _, _, err := m.Put(ctx, third, first.Version, now); !errors.Is(err, ErrVersion) {
		t.Fatalf("replace at an old version: %v, want ErrVersion", err)
	}
	elsewhere := valid()
	elsewhere.Key = "absent"
	if _, _, err := m.Put(ctx, elsewhere, Existing, now); !errors.Is(err, ErrVersion) {
		t.Fatalf("replace any version where none exists: %v, want ErrVersion", err)
	}
	if _, err := m.Delete(ctx, w.ID, first.Version, now); !errors.Is(err, ErrVersion) {
		t.Fatalf("delete at an old version: %v", err)
	}
	if _, err := m.Delete(ctx, w.ID, w.Version, now); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Delete(ctx, w.ID, -1, now); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete again: %v, want ErrNotFound", err)
	}
	list, version, _ := m.Load(ctx)
	if len(list) != 0 || version != 3 {
		t.Fatalf("after: %d overrides at version %d, want 0 at 3", len(list), version)
	}
}

// At most MaxOverrides are held; an expired one makes room at the next
// change, with no timer.
func TestAtMostMaxOverrides(t *testing.T) {
	ctx := context.Background()
	var m Memory
	for i := range MaxOverrides {
		o := valid()
		o.Key = string(rune('a'+i%26)) + strings.Repeat("x", i/26)
		if i == 0 {
			o.Expires = now.Add(time.Minute)
		}
		if _, _, err := m.Put(ctx, o, 0, now); err != nil {
			t.Fatalf("override %d: %v", i, err)
		}
	}
	extra := valid()
	extra.Key = "one more"
	if _, _, err := m.Put(ctx, extra, 0, now); !errors.Is(err, ErrFull) {
		t.Fatalf("one more than %d: %v, want ErrFull", MaxOverrides, err)
	}
	if _, _, err := m.Put(ctx, extra, 0, now.Add(2*time.Minute)); err != nil {
		t.Fatalf("once one expired: %v", err)
	}
}

func TestFindPrefersTheExactKeyThenTheLongestPrefix(t *testing.T) {
	mk := func(key, prefix string, a Action) *Override {
		return &Override{ID: IDOf("r", key, prefix), Rule: "r", Key: key, Prefix: prefix, Action: a, UntilRemoved: true}
	}
	s := NewSet(1, []*Override{mk("", "a", Exempt), mk("", "abc", Block), mk("abcd", "", Limit), mk("", "ab", Exempt)})
	for key, want := range map[string]string{"abcd": "abcd", "abce": "p:abc", "abx": "p:ab", "ax": "p:a", "b": "", "": ""} {
		got := ""
		if o := s.Find("r", key, now); o != nil {
			got = o.Key
			if o.Prefix != "" {
				got = "p:" + o.Prefix
			}
		}
		if got != want {
			t.Errorf("Find(%q) = %q, want %q", key, got, want)
		}
	}
	if s.Find("other", "abcd", now) != nil {
		t.Fatal("an override found under another rule")
	}
	expired := &Override{Rule: "r", Key: "x", Action: Block, Expires: now}
	if NewSet(2, []*Override{expired}).Find("r", "x", now) != nil {
		t.Fatal("an override found at its expiry")
	}
}
