package rules

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"math/rand/v2"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"unicode/utf16"
)

// Models of what the common servers read from a body for a field, each
// written apart from sluice's reader. The property that body key sources
// hold (see bodyValue): when sluice counts a value, no model finds another;
// when sluice finds no value, no model finds one. A model that finds
// nothing is no contradiction: the upstream then has no value to act on.
//
// The models, and when each applies:
//   - Go's encoding/json into a struct: names in any case, the last wins;
//     JSON types, or any type for a framework told to parse JSON anyway.
//   - Python's json (Flask, Django, FastAPI): the exact name, the last wins;
//     reads NaN and Infinity, and UTF-16 or UTF-32 by their zero bytes; a
//     number as the whole number an app would print with int().
//   - Express (body-parser, qs): inflates gzip; JSON types with any
//     nesting, the value as `${value}` prints it (an array joined by ","),
//     forms with phone[] or phone[0] read as phone.
//   - Forms: Go's FormValue (the first), PHP and Django (the last), older
//     Python (";" separates pairs too).
//   - Multipart: the parts a multipart parser reads (no preamble), the
//     first and the last.
func models(body []byte, h http.Header, name string) []string {
	ct := h.Get("Content-Type")
	mt, params, _ := mime.ParseMediaType(ct)
	gzipped := h.Get("Content-Encoding") == "gzip"
	var out []string
	if gzipped { // only Express inflates
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			return nil
		}
		plain, err := io.ReadAll(zr)
		if err != nil {
			return nil
		}
		if mt == "application/json" || mt == "" || mt == "text/plain" {
			out = append(out, expressJSON(plain, name)...)
		}
		if mt == "application/x-www-form-urlencoded" {
			out = append(out, qsForm(string(plain), name)...)
		}
		return out
	}
	if mt == "multipart/form-data" {
		mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
		var vs []string
		for {
			p, err := mr.NextPart()
			if err != nil {
				break
			}
			if p.FormName() == name && p.FileName() == "" {
				b, _ := io.ReadAll(p)
				vs = append(vs, string(b))
			}
		}
		if len(vs) > 0 {
			out = append(out, vs[0], vs[len(vs)-1])
		}
		return out
	}
	// JSON: any type, since frameworks can be told to parse it regardless.
	out = append(out, goJSON(body, name)...)
	out = append(out, pythonJSON(body, name)...)
	out = append(out, expressJSON(body, name)...)
	if mt == "application/x-www-form-urlencoded" {
		vs, _ := url.ParseQuery(string(body))
		if len(vs[name]) > 0 {
			out = append(out, vs[name][0], vs[name][len(vs[name])-1])
		}
		out = append(out, qsForm(string(body), name)...)
		out = append(out, phpForm(string(body), name)...)
		for _, part := range strings.Split(string(body), ";") { // older Python
			if vs, err := url.ParseQuery(part); err == nil && len(vs[name]) > 0 {
				out = append(out, vs[name][len(vs[name])-1])
			}
		}
	}
	return out
}

func goJSON(body []byte, name string) []string {
	body = bytes.TrimPrefix(bytes.TrimSpace(body), []byte("\xef\xbb\xbf"))
	var fields []struct {
		k string
		v json.RawMessage
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil
		}
		var raw json.RawMessage
		if dec.Decode(&raw) != nil {
			return nil
		}
		fields = append(fields, struct {
			k string
			v json.RawMessage
		}{t.(string), raw})
	}
	if !json.Valid(body) {
		return nil
	}
	last := ""
	found := false
	for _, f := range fields {
		if strings.EqualFold(f.k, name) {
			var s string
			if json.Unmarshal(f.v, &s) == nil {
				last, found = s, true
			} else if n, ok := new(big.Float).SetString(string(f.v)); ok {
				last, found = string(f.v), true // a number field, printed as an integer if it is one
				if n.IsInt() {
					last = n.Text('f', 0)
				}
			}
		}
	}
	if found {
		return []string{last}
	}
	return nil
}

func pythonJSON(body []byte, name string) []string {
	text := string(body)
	if len(body) >= 2 && (body[0] == 0 || body[1] == 0 || body[0] == 0xff || body[0] == 0xfe) {
		u := make([]uint16, 0, len(body)/2)
		le := body[1] == 0 || body[0] == 0xff
		for i := 0; i+1 < len(body); i += 2 {
			if le {
				u = append(u, uint16(body[i])|uint16(body[i+1])<<8)
			} else {
				u = append(u, uint16(body[i])<<8|uint16(body[i+1]))
			}
		}
		text = string(utf16.Decode(u))
	}
	text = strings.TrimPrefix(strings.TrimSpace(text), "\ufeff")
	text = strings.NewReplacer(":NaN", ":null", ":Infinity", ":null").Replace(text)
	var m map[string]any
	d := json.NewDecoder(strings.NewReader(text))
	d.UseNumber()
	if d.Decode(&m) != nil || d.More() {
		return nil
	}
	switch v := m[name].(type) {
	case string:
		return []string{v}
	case json.Number: // as an application's int() reads it
		if f, ok := new(big.Float).SetString(v.String()); ok {
			i, _ := f.Int(nil)
			return []string{i.String()}
		}
		return []string{v.String()}
	}
	return nil
}

// phpForm is PHP's $_POST: names lose leading spaces, end at a NUL, and
// read " " and "." as "_"; the last value wins.
func phpForm(raw, name string) []string {
	var last string
	found := false
	for _, pair := range strings.Split(raw, "&") {
		k, v, _ := strings.Cut(pair, "=")
		k, err1 := url.QueryUnescape(k)
		v, err2 := url.QueryUnescape(v)
		if err1 != nil || err2 != nil {
			continue
		}
		if i := strings.IndexByte(k, 0); i >= 0 {
			k = k[:i]
		}
		k = strings.NewReplacer(" ", "_", ".", "_").Replace(strings.TrimLeft(k, " "))
		if k == name {
			last, found = v, true
		}
	}
	if found {
		return []string{last}
	}
	return nil
}

func expressJSON(body []byte, name string) []string {
	text := strings.TrimPrefix(strings.TrimSpace(string(body)), "\ufeff")
	var m map[string]any
	d := json.NewDecoder(strings.NewReader(text))
	d.UseNumber()
	if d.Decode(&m) != nil || d.More() {
		return nil
	}
	v, ok := m[name]
	if !ok {
		return nil
	}
	return []string{jsString(v)}
}

// jsString is `${v}` in JavaScript, for the values the generator makes.
func jsString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case json.Number:
		f, _ := new(big.Float).SetString(v.String())
		if f.IsInt() {
			return f.Text('f', 0)
		}
		return v.String()
	case nil:
		return "null"
	case bool:
		return fmt.Sprint(v)
	case []any:
		parts := make([]string, len(v))
		for i, x := range v {
			parts[i] = jsString(x)
		}
		return strings.Join(parts, ",")
	}
	return "[object Object]"
}

// qsForm is Express's urlencoded parser (qs): phone, phone[] and phone[0]
// are one field, read as `${value}`.
func qsForm(raw, name string) []string {
	var vs []string
	for _, pair := range strings.Split(raw, "&") {
		k, v, _ := strings.Cut(pair, "=")
		k, err1 := url.QueryUnescape(k)
		v, err2 := url.QueryUnescape(v)
		if err1 != nil || err2 != nil {
			continue
		}
		if k == name || strings.HasPrefix(k, name+"[") {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return nil
	}
	return []string{strings.Join(vs, ",")}
}

// A random body built from the tricks that servers read in different ways.
// gzipWriter is reset for each compressed body: a new writer's buffers,
// under -race, cost the property test nine tenths of its time.
var gzipWriter = gzip.NewWriter(io.Discard)

func randomBody(rng *rand.Rand) ([]byte, http.Header) {
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	values := []string{"8801799999999", "8801700000001", "x y"}
	h := http.Header{}
	type field struct{ name, json, form string }
	var fields []field
	for range 1 + rng.IntN(3) {
		name := pick("phone", "phone", "PHONE", "Phone", "other", "phone[]", "phone[0]", " phone", "phone\x00x")
		v := pick(values...)
		jv := fmt.Sprintf("%q", v)
		switch rng.IntN(8) {
		case 0:
			jv = pick("8801799999999", "8.801799999999e12", "8801799999999.0", "1", "8801799999999.5")
		case 1:
			jv = pick("null", `["8801799999999"]`, "{}", "true", "NaN")
		}
		fields = append(fields, field{name, jv, url.QueryEscape(v)})
	}
	var body string
	kind := rng.IntN(3)
	switch kind {
	case 0: // JSON
		parts := make([]string, len(fields))
		for i, f := range fields {
			parts[i] = fmt.Sprintf("%q:%s", f.name, f.json)
		}
		if rng.IntN(6) == 0 { // a form planted in a string
			parts = append(parts, fmt.Sprintf(`"x":"&phone=%s&"`, pick(values...)))
		}
		body = pick("", "\ufeff", " \n") + "{" + strings.Join(parts, ",") + "}" + pick("", "", "", " {}", "x")
		h.Set("Content-Type", pick("application/json", "text/plain", "", "application/x-www-form-urlencoded", "application/json; charset=utf-8"))
	case 1: // form
		parts := make([]string, len(fields))
		for i, f := range fields {
			parts[i] = url.QueryEscape(f.name) + "=" + f.form
		}
		sep := pick("&", "&", ";")
		body = pick("", "", "{=1&") + strings.Join(parts, sep)
		if rng.IntN(8) == 0 {
			body += "&phone=%zz"
		}
		h.Set("Content-Type", pick("application/x-www-form-urlencoded", "", "text/plain", "application/json"))
	default: // multipart, with a preamble a form parser would read
		var b bytes.Buffer
		if rng.IntN(2) == 0 {
			fmt.Fprintf(&b, "x&phone=%s&\r\n", pick(values...))
		}
		mw := multipart.NewWriter(&b)
		for _, f := range fields {
			v, _ := url.QueryUnescape(f.form)
			if rng.IntN(6) == 0 {
				w, _ := mw.CreateFormFile(f.name, "f.txt")
				w.Write([]byte(v))
			} else {
				mw.WriteField(f.name, v)
			}
		}
		mw.Close()
		body = b.String()
		h.Set("Content-Type", pick("multipart/form-data; boundary="+mw.Boundary(), "application/x-www-form-urlencoded"))
	}
	raw := []byte(body)
	switch rng.IntN(10) {
	case 0: // compressed
		var z bytes.Buffer
		zw := gzipWriter
		zw.Reset(&z)
		zw.Write(raw)
		zw.Close()
		raw = z.Bytes()
		h.Set("Content-Encoding", "gzip")
	case 1: // UTF-16
		u := utf16.Encode([]rune(body))
		raw = make([]byte, 0, 2*len(u))
		for _, c := range u {
			raw = append(raw, byte(c), byte(c>>8))
		}
	}
	return raw, h
}

func TestBodyKeysAreWhatEveryReaderReads(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 8))
	states := map[KeyState]int{}
	for i := range 30000 {
		body, h := randomBody(rng)
		v, state := bodyValue(body, false, h, "phone")
		states[state]++
		read := models(body, h, "phone")
		switch state {
		case KeyFound:
			for _, r := range read {
				if r != v {
					t.Fatalf("case %d: %q %v: sluice counts %q, a server reads %q", i, body, h, v, r)
				}
			}
		case KeyMissing:
			if len(read) > 0 {
				t.Fatalf("case %d: %q %v: sluice finds no phone, a server reads %q", i, body, h, read)
			}
		}
	}
	t.Logf("states (found, missing, ambiguous, too large, unreadable): %v", states)
	// The generator must reach every outcome, or the property says little.
	for _, s := range []KeyState{KeyFound, KeyMissing, KeyAmbiguous, KeyUnreadable} {
		if states[s] < 500 {
			t.Errorf("only %d of the bodies gave state %d: %v", states[s], s, states)
		}
	}
}

// The tricks of an outside review, each of which once reached the
// upstream as the victim's while sluice counted something else.
func TestBodyKeyTricksAreRefused(t *testing.T) {
	const victim = "8801799999999"
	deep := `{"a":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `,"phone":"` + victim + `"}`
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(`{"phone":"` + victim + `","x":"&phone=r1&"}`))
	zw.Close()
	u16 := utf16.Encode([]rune(`{"phone":"` + victim + `"}`))
	le := []byte{0xff, 0xfe}
	for _, c := range u16 {
		le = append(le, byte(c), byte(c>>8))
	}
	for _, c := range []struct {
		name, ct, ce, body string
		want               KeyState
	}{
		{"a multipart preamble", "multipart/form-data; boundary=XyZ", "", "x&phone=r1&\r\n--XyZ\r\nContent-Disposition: form-data; name=\"phone\"\r\n\r\n" + victim + "\r\n--XyZ--\r\n", KeyFound},
		{"multipart without a boundary", "multipart/form-data", "", "--XyZ\r\nContent-Disposition: form-data; name=\"phone\"\r\n\r\n" + victim + "\r\n--XyZ--\r\n", KeyUnreadable},
		{"a multipart file named phone", "multipart/form-data; boundary=XyZ", "", "--XyZ\r\nContent-Disposition: form-data; name=\"phone\"; filename=\"a\"\r\n\r\n" + victim + "\r\n--XyZ--\r\n", KeyAmbiguous},
		{"multipart cut short", "multipart/form-data; boundary=XyZ", "", "--XyZ\r\nContent-Disposition: form-data; name=\"phone\"\r\n\r\n" + victim, KeyUnreadable},
		{"gzip", "application/json", "gzip", gz.String(), KeyUnreadable},
		{"any other Content-Encoding", "application/json", "br", `{"phone":"` + victim + `"}`, KeyUnreadable},
		{"not UTF-8", "application/x-www-form-urlencoded", "", "phone=" + victim + "&x=\xff", KeyUnreadable},
		{"identity", "application/json", "identity", `{"phone":"` + victim + `"}`, KeyFound},
		{"a form that starts with a brace", "application/x-www-form-urlencoded", "", "{=1&phone=" + victim, KeyUnreadable},
		{"NaN", "application/json", "", `{"a":NaN,"phone":"` + victim + `"}`, KeyUnreadable},
		{"UTF-16 with its byte order mark", "application/json", "", string(le), KeyUnreadable},
		{"a UTF-16 charset", "application/json; charset=utf-16le", "", `{"phone":"` + victim + `"}`, KeyUnreadable},
		{"nesting beyond Go's", "application/json", "", deep, KeyUnreadable},
		{"an array value", "application/json", "", `{"phone":["` + victim + `"]}`, KeyAmbiguous},
		{"null", "application/json", "", `{"phone":null}`, KeyAmbiguous},
		{"data after the object", "application/json", "", `{"phone":"r1"} {"phone":"` + victim + `"}`, KeyUnreadable},
		{"phone[]", "application/x-www-form-urlencoded", "", "phone[]=" + victim, KeyAmbiguous},
		{"phone[0] after phone", "application/x-www-form-urlencoded", "", "phone=r1&phone%5B0%5D=" + victim, KeyAmbiguous},
		{"a ; separator", "application/x-www-form-urlencoded", "", "phone=r1;phone=" + victim, KeyAmbiguous},
		{"a malformed escape", "application/x-www-form-urlencoded", "", "phone=" + victim + "%zz", KeyAmbiguous},
		{"a JSON string planting a form", "application/x-www-form-urlencoded", "", `{"phone":"r1","x":"&phone=` + victim + `&"}`, KeyAmbiguous},
		{"a number written as a float", "application/json", "", `{"phone":8801799999999.0}`, KeyFound},
		{"a number with a fraction", "application/json", "", `{"phone":8801799999999.25}`, KeyAmbiguous},
		{"a number beyond 2^53", "application/json", "", `{"phone":88017999999990000}`, KeyAmbiguous},
		{"name* in a part (Go reads it, Werkzeug and PHP read name)", "multipart/form-data; boundary=XyZ", "", "--XyZ\r\nContent-Disposition: form-data; name*=UTF-8''phone; name=\"zzz\"\r\n\r\nr1\r\n--XyZ\r\nContent-Disposition: form-data; name*=UTF-8''x; name=\"phone\"\r\n\r\n" + victim + "\r\n--XyZ--\r\n", KeyUnreadable},
		{"a part disposition Go cannot parse", "multipart/form-data; boundary=XyZ", "", "--XyZ\r\nContent-Disposition: form-data; name=\"phone\"; junk\r\n\r\n" + victim + "\r\n--XyZ--\r\n", KeyUnreadable},
		{"an attachment part", "multipart/form-data; boundary=XyZ", "", "--XyZ\r\nContent-Disposition: attachment; name=\"phone\"\r\n\r\n" + victim + "\r\n--XyZ--\r\n", KeyUnreadable},
		{"two dispositions in a part", "multipart/form-data; boundary=XyZ", "", "--XyZ\r\nContent-Disposition: form-data; name=\"x\"\r\nContent-Disposition: form-data; name=\"phone\"\r\n\r\n" + victim + "\r\n--XyZ--\r\n", KeyUnreadable},
		{"a part in base64 charset (busboy decodes it)", "multipart/form-data; boundary=XyZ", "", "--XyZ\r\nContent-Disposition: form-data; name=\"phone\"\r\nContent-Type: text/plain; charset=base64\r\n\r\nODgwMTc5OTk5OTk5OQ==\r\n--XyZ--\r\n", KeyUnreadable},
		{"a part in UTF-8", "multipart/form-data; boundary=XyZ", "", "--XyZ\r\nContent-Disposition: form-data; name=\"phone\"\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n" + victim + "\r\n--XyZ--\r\n", KeyFound},
		{"a PHP name with a leading space", "application/x-www-form-urlencoded", "", "phone=r1&+phone=" + victim, KeyAmbiguous},
		{"a PHP name cut at a NUL", "application/x-www-form-urlencoded", "", "phone=r1&phone%00x=" + victim, KeyAmbiguous},
		{"a PHP name alone", "application/x-www-form-urlencoded", "", "%20phone=" + victim, KeyFound},
		{"a PHP part name", "multipart/form-data; boundary=XyZ", "", "--XyZ\r\nContent-Disposition: form-data; name=\"phone\"\r\n\r\nr1\r\n--XyZ\r\nContent-Disposition: form-data; name=\" phone\"\r\n\r\n" + victim + "\r\n--XyZ--\r\n", KeyAmbiguous},
		{"a byte order mark before a form (body-parser drops it)", "application/x-www-form-urlencoded", "", "\ufeffphone=" + victim, KeyFound},
		{"a type PHP cuts at a space", "application/x-www-form-urlencoded x+json", "", "phone=" + victim, KeyUnreadable},
		{"a type PHP cuts at a comma", "multipart/form-data,x; boundary=XyZ", "", "--XyZ\r\nContent-Disposition: form-data; name=\"phone\"\r\n\r\n" + victim + "\r\n--XyZ--\r\n", KeyUnreadable},
		{"a number with an exponent", "application/json", "", `{"phone":8.801799999999e12}`, KeyFound},
	} {
		h := http.Header{"Content-Type": {c.ct}}
		if c.ce != "" {
			h.Set("Content-Encoding", c.ce)
		}
		v, state := bodyValue([]byte(c.body), false, h, "phone")
		if state != c.want || state == KeyFound && v != victim {
			t.Errorf("%s: %q, state %d; want %q, state %d", c.name, v, state, victim, c.want)
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

// Frameworks that merge the query and the body (Flask's request.values
// reads the query first) read a phone in the query of a POST: it is one
// more reading of a body source.
func TestBodyKeysReadTheQueryToo(t *testing.T) {
	src := &Source{Kind: FromBody, Param: "phone"}
	form := http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}
	for _, c := range []struct {
		query, body string
		want        string
		state       KeyState
	}{
		{"phone=8801799999999", "phone=8801700000001", "", KeyAmbiguous},
		{"phone=8801799999999", "", "8801799999999", KeyFound},
		{"phone=8801799999999", "phone=8801799999999", "8801799999999", KeyFound},
		{"other=1", "phone=8801700000001", "8801700000001", KeyFound},
	} {
		v, state := src.appendValue(nil, &Request{RawQuery: c.query, Body: []byte(c.body), Header: form}, "", 64)
		if string(v) != c.want || state != c.state {
			t.Errorf("?%s with %q: %q (%d), want %q (%d)", c.query, c.body, v, state, c.want, c.state)
		}
	}
	// Where the body is never seen (forward-auth), the query alone says
	// nothing of it: the phone is missing, not the query's.
	if v, state := src.appendValue(nil, &Request{RawQuery: "phone=8801700000001", Header: form, BodyUnseen: true}, "", 64); state != KeyMissing {
		t.Errorf("an unseen body with a query phone: %q (%d), want missing", v, state)
	}
}

// What reading a body key costs, by the body's form: every reading that
// applies, so a form or a JSON object is read twice (JSON and form) unless
// its type says which.
func BenchmarkBodyKey(b *testing.B) {
	src := &Source{Kind: FromBody, Param: "phone"}
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	mw.WriteField("name", "Ana")
	mw.WriteField("phone", "8801799999999")
	mw.Close()
	for _, c := range []struct{ name, ct, body string }{
		{"json", "application/json", `{"name":"Ana","phone":"8801799999999","country":"BD"}`},
		{"json-untyped", "", `{"name":"Ana","phone":"8801799999999","country":"BD"}`},
		{"form", "application/x-www-form-urlencoded", "name=Ana&phone=8801799999999&country=BD"},
		{"multipart", "multipart/form-data; boundary=" + mw.Boundary(), mp.String()},
	} {
		req := &Request{Header: http.Header{"Content-Type": {c.ct}}, Body: []byte(c.body)}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			var buf []byte
			for b.Loop() {
				var st KeyState
				buf, st = src.appendValue(buf[:0], req, "", 64)
				if st != KeyFound {
					b.Fatal(st)
				}
			}
		})
	}
}
