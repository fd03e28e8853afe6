package h2grpc

import (
	"math"
	"strings"
	"testing"
	"time"
)

// TestParseTimeoutUnits: grpc-timeout's units are those of the gRPC
// protocol over HTTP/2 (H hours, M minutes, S seconds, m milliseconds,
// u microseconds, n nanoseconds), at most 8 digits; anything else is no
// deadline. A lower-case m read as minutes would give a 5 ms call five
// minutes.
func TestParseTimeoutUnits(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"5m", 5 * time.Millisecond, true},
		{"5M", 5 * time.Minute, true},
		{"2H", 2 * time.Hour, true},
		{"3S", 3 * time.Second, true},
		{"7u", 7 * time.Microsecond, true},
		{"9n", 9, true},
		{"99999999S", 99999999 * time.Second, true},
		{"99999999H", math.MaxInt64, true},      // saturates
		{"2562047H", 2562047 * time.Hour, true}, // the most hours below 2^63 ns: not saturated
		{"0m", 0, true},
		{"", 0, false},
		{"m", 0, false},
		{"123456789S", 0, false}, // nine digits
		{"5s", 0, false},
		{"-5S", 0, false},
		{"5 S", 0, false},
	} {
		got, ok := parseTimeout(c.in)
		if ok != c.ok || ok && time.Duration(got) != c.want {
			t.Errorf("parseTimeout(%q) = %v, %v; want %v, %v", c.in, time.Duration(got), ok, c.want, c.ok)
		}
	}
}

// grpc-message is percent-encoded as gRPC specifies: printable ASCII but
// '%' as is, the rest as %XX, at most 1 KiB of it.
func TestEncodeMessage(t *testing.T) {
	for in, want := range map[string]string{
		"plain ~ text":            "plain ~ text",
		"100%":                    "100%25",
		"naïve\n":                 "na%C3%AFve%0A",
		strings.Repeat("a", 1025): strings.Repeat("a", 1024),
	} {
		if got := encodeMessage(in); got != want {
			t.Errorf("encodeMessage(%.20q) = %.30q, want %.30q", in, got, want)
		}
	}
}
