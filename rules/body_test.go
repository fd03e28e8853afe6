package rules

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// What the common servers read from a body for a field: the property the
// body key sources hold is that when sluice counts a value, no reader finds
// another. Readers: Go's encoding/json (names in any case, the last wins),
// Python's and JavaScript's JSON (exact name, the last wins), Go's
// FormValue (the first), PHP and Django (the last). A reader that finds
// nothing is no contradiction: the upstream then has no value to act on.
func readers(body []byte, contentType, name string) []string {
	var out []string
	if trimmed := strings.TrimLeft(strings.TrimPrefix(strings.TrimLeft(string(body), " \t\r\n"), "\ufeff"), " \t\r\n"); strings.HasPrefix(trimmed, "{") {
		var anyCase map[string]any
		if json.Unmarshal([]byte(trimmed), &anyCase) == nil { // Go: unmarshal into a struct matches any case; the last wins
			var last string
			found := false
			dec := json.NewDecoder(strings.NewReader(trimmed))
			dec.UseNumber()
			dec.Token()
			for dec.More() {
				t, _ := dec.Token()
				var raw json.RawMessage
				dec.Decode(&raw)
				if k, _ := t.(string); strings.EqualFold(k, name) {
					if v, ok := scalar(raw); ok {
						last, found = v, true
					}
				}
			}
			if found {
				out = append(out, last)
			}
			if v, ok := anyCase[name]; ok { // Python, JavaScript: the exact name, the last
				switch v := v.(type) {
				case string:
					out = append(out, v)
				case float64:
					out = append(out, fmt.Sprint(json.Number(fmt.Sprint(v))))
				}
			}
		}
		return out
	}
	if vs, err := url.ParseQuery(string(body)); err == nil && len(vs[name]) > 0 {
		out = append(out, vs[name][0], vs[name][len(vs[name])-1]) // Go's FormValue; PHP and Django
	}
	return out
}

func TestBodyKeysAreWhatEveryReaderReads(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 8))
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	values := []string{"victim", "other", "12345", "x y"}
	for i := range 20000 {
		var body string
		ct := pick("application/json", "text/plain", "", "application/x-www-form-urlencoded", "application/octet-stream")
		n := 1 + rng.IntN(3)
		if rng.IntN(2) == 0 { // JSON
			var fields []string
			for range n {
				name := pick("phone", "PHONE", "Phone", "phone", "other")
				v := pick(values...)
				if rng.IntN(5) == 0 {
					fields = append(fields, fmt.Sprintf("%q:%s", name, pick("1", "null", "[1]", "{}")))
				} else {
					fields = append(fields, fmt.Sprintf("%q:%q", name, v))
				}
			}
			body = pick("", "\ufeff", " \n") + "{" + strings.Join(fields, ",") + "}"
		} else { // form
			var pairs []string
			for range n {
				pairs = append(pairs, pick("phone", "phone", "other")+"="+url.QueryEscape(pick(values...)))
			}
			body = strings.Join(pairs, "&")
		}
		v, state := bodyValue([]byte(body), false, ct, "phone")
		read := readers([]byte(body), ct, "phone")
		if state == KeyFound {
			for _, r := range read {
				if r != v {
					t.Fatalf("case %d: %q (%s): sluice counts %q, a reader reads %q", i, body, ct, v, r)
				}
			}
		}
		if state == KeyMissing && len(read) > 0 {
			t.Fatalf("case %d: %q (%s): sluice finds no phone, a reader reads %q", i, body, ct, read)
		}
	}
}

// A body over the bound is too large to read a key from, whatever it holds.
func TestBodyKeysOfATruncatedBodyAreTooLarge(t *testing.T) {
	req := &Request{Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"phone":"1","pad":"`), BodyTruncated: true}
	if _, state := (&Source{Kind: FromBody, Param: "phone"}).appendValue(nil, req, "", 64); state != KeyBodyTooLarge {
		t.Fatalf("state %v, want KeyBodyTooLarge", state)
	}
}
