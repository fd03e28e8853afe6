package httplimit

import (
	"net/http"
	"strconv"
	"unicode/utf8"
)

// AppendProblem appends p as JSON and a newline, byte for byte what a
// json.Encoder with SetEscapeHTML(false) writes for it (U+2028 and U+2029
// escaped, each byte of invalid UTF-8 written as U+FFFD; "<" left as it
// is, since the answers are for programs, never embedded in a page),
// without allocating: for servers that answer many refusals from a buffer
// of their own. Every problem+json body sluice writes goes through it.
func AppendProblem(b []byte, p *Problem) []byte {
	b = append(b, `{"type":`...)
	b = appendJSONString(b, p.Type)
	b = append(b, `,"title":`...)
	b = appendJSONString(b, p.Title)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(p.Status), 10)
	b = append(b, `,"detail":`...)
	b = appendJSONString(b, p.Detail)
	if len(p.ViolatedPolicies) > 0 {
		b = append(b, `,"violated-policies":[`...)
		for i, v := range p.ViolatedPolicies {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, v)
		}
		b = append(b, ']')
	}
	if p.Field != "" {
		b = append(b, `,"field":`...)
		b = appendJSONString(b, p.Field)
	}
	return append(b, "}\n"...)
}

// WriteProblem writes p as application/problem+json with its status, not
// to be stored by caches.
func WriteProblem(w http.ResponseWriter, p *Problem) {
	h := w.Header()
	h["Content-Type"] = []string{problemContentType}
	h["Cache-Control"] = []string{"no-store"}
	w.WriteHeader(p.Status)
	bp := headerBufs.Get().(*[]byte)
	*bp = AppendProblem((*bp)[:0], p)
	w.Write(*bp)
	headerBufs.Put(bp)
}

// appendJSONString appends s as a JSON string, escaped as encoding/json
// escapes it without HTML escapes.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0 // s[start:i] needs no escaping: it is copied in one append
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if jsonPlain[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default: // the other control characters
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&15])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// jsonPlain marks the ASCII bytes appendJSONString copies as they are: not
// a control character, a quote or a backslash.
var jsonPlain = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()
