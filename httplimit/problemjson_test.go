package httplimit

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// encoded is v as a json.Encoder without HTML escapes writes it, newline
// and all.
func encoded(v any) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
	return b.String()
}

// Every problem+json body is written by AppendProblem: it must be what
// encoding/json writes (without HTML escapes), whatever the strings hold.
func TestAppendProblemIsJSON(t *testing.T) {
	p := &Problem{Type: "https://x/#q", Title: "Quota \"Exceeded\"", Status: 429,
		Detail: "a\\b\n\tc é <&> \u2028\x01 \xff\xfe bad", ViolatedPolicies: []string{"a", "b\x80"}, Field: "request.path"}
	if got, want := string(AppendProblem(nil, p)), encoded(p); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	p.ViolatedPolicies, p.Field = nil, ""
	if got, want := string(AppendProblem(nil, p)), encoded(p); got != want {
		t.Fatalf("without policies or field: got  %s\nwant %s", got, want)
	}
}

// On random bytes (invalid UTF-8, truncated sequences, U+2028 and its
// neighbours, controls, HTML characters), appendJSONString writes what
// encoding/json does without HTML escapes.
func TestAppendJSONStringIsJSONOnRandomBytes(t *testing.T) {
	pieces := []string{"a", "é", "\u2028", "\u2029", "\u2027", "\u202a", "\xe2\x80", "\xe2", "\xff", "\xc3", "\x80", "<", "&", ">", "\"", "\\", "\x00", "\x1f", "\x7f", "\n", "\U0001F600", "\xf0\x9f\x98"}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		var s string
		for range rng.IntN(8) {
			s += pieces[rng.IntN(len(pieces))]
		}
		if got, want := string(appendJSONString(nil, s))+"\n", encoded(s); got != want {
			t.Fatalf("appendJSONString(%q) = %s, want %s", s, got, want)
		}
	}
}

func FuzzAppendJSONStringIsJSON(f *testing.F) {
	for _, s := range []string{"", "plain", "\"", "a\\", "<x>&", "\u2028\u2029", "é\u2027\u202a", "\x00\x1f\x7f", "ends in \n", "\u2028", "\xff", "\xe2\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := string(appendJSONString(nil, s))+"\n", encoded(s); got != want {
			t.Fatalf("appendJSONString(%q) = %s, want %s", s, got, want)
		}
	})
}
