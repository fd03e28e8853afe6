package rules

import (
	"strings"
	"testing"
)

func TestNormalizePath(t *testing.T) {
	for _, tc := range []struct {
		o        PathOptions
		in, want string
	}{
		{PathOptions{}, "/otp", "/otp"},
		{PathOptions{}, "/", "/"},
		{PathOptions{}, "//otp", "/otp"},
		{PathOptions{}, "/otp/", "/otp"},
		{PathOptions{KeepTrailingSlash: true}, "/otp/", "/otp/"},
		{PathOptions{KeepTrailingSlash: true}, "/otp//", "/otp/"},
		{PathOptions{KeepTrailingSlash: true}, "/a/b/..", "/a/"},
		{PathOptions{}, "/./otp", "/otp"},
		{PathOptions{}, "/a/b/../../otp", "/otp"},
		{PathOptions{}, "/../../otp", "/otp"},
		{PathOptions{}, "/..", "/"},
		{PathOptions{}, "/%6Ftp", "/otp"},
		{PathOptions{}, "/%6ftp", "/otp"},
		{PathOptions{}, "/%2e%2e/otp", "/otp"},
		{PathOptions{DecodeSeparators: true}, "/a%2fb", "/a/b"},
		{PathOptions{DecodeSeparators: true}, "/x/..%2Fotp", "/otp"},
		{PathOptions{DecodeSeparators: true}, "/x/..%5cotp", "/otp"},
		{PathOptions{DecodeSeparators: true}, "/x\\..\\otp", "/otp"},
		{PathOptions{DecodeSeparators: true}, "/api%252fotp", "/api/otp"},
		{PathOptions{}, "/otp;a=b", "/otp"},
		{PathOptions{}, "/x/..;/otp", "/otp"},
		{PathOptions{}, "/a;v=1/b;w=2", "/a/b"},
		{PathOptions{}, "/;x/otp", "/otp"},
		{PathOptions{}, "/otp%3Ba=b", "/otp%3Ba=b"},
		{PathOptions{Params: ParamsKeep}, "/otp;a=b", "/otp;a=b"},
		{PathOptions{Params: ParamsKeep}, "/x/..;/otp", "/x/..;/otp"},
		{PathOptions{}, "/%41%7e", "/A~"},
		{PathOptions{}, "/.well-known/x", "/.well-known/x"},
		{PathOptions{}, "/a/.b/..c", "/a/.b/..c"},
		{PathOptions{}, "/OTP/Verify", "/OTP/Verify"}, // the case is the upstream's: folded only to match (MatchForm)
		{PathOptions{CaseSensitive: true}, "/OTP", "/OTP"},
		{PathOptions{}, "*", "*"},
		{PathOptions{}, "", ""},
	} {
		if got, ok := tc.o.Normalize(tc.in); got != tc.want || !ok {
			t.Errorf("%+v.Normalize(%q) = %q, %v; want %q", tc.o, tc.in, got, ok, tc.want)
		}
	}
}

// What servers read in different ways is refused by default: an encoded
// slash or backslash, once or twice escaped and in any case, a raw
// backslash; a ";" with ParamsReject.
func TestNormalizeRefusesWhatServersReadDifferently(t *testing.T) {
	for _, in := range []string{"/a%2Fb", "/a%2fb", "/%2Fotp", "/x/..%2Fotp", "/api%2Fotp", "/a%5Cb", "/a%5cb", "/otp\\", "/x\\..\\otp", "/a%252Fb", "/a%252fb", "/a%255Cb", "/%2F"} {
		if got, ok := (PathOptions{}).Normalize(in); ok {
			t.Errorf("Normalize(%q) = %q: want it refused", in, got)
		}
	}
	for _, in := range []string{"/otp;a", "/;"} {
		if got, ok := (PathOptions{Params: ParamsReject}).Normalize(in); ok {
			t.Errorf("ParamsReject: Normalize(%q) = %q: want it refused", in, got)
		}
	}
	for _, in := range []string{"/a%2Eb", "/a%25", "/a%252", "/a%25Fb", "/%252", "/a%2E%2E"} {
		if _, ok := (PathOptions{}).Normalize(in); !ok {
			t.Errorf("Normalize(%q) refused: no separator in it", in)
		}
	}
}

func TestNormalizeKeepsANormalPathWithoutAllocating(t *testing.T) {
	o := PathOptions{}
	if n := testing.AllocsPerRun(100, func() { o.Normalize("/users/42/orders") }); n != 0 {
		t.Fatalf("%v allocations for a normal path", n)
	}
}

// Normal form is a fixed point, starts with "/", and has no empty or dot
// segment: nothing is left for a second pass, or an upstream, to resolve.
func FuzzNormalizePath(f *testing.F) {
	for _, s := range []string{"/otp", "//otp/", "/./a/../b", "/%6F%2f%2E%2E", "/a/%2e%2E/b", "/%%41", "/.../..../."} {
		f.Add(s, false, false, false, uint8(0))
	}
	for _, s := range []string{"/x/..%2Fotp", "/a\\b", "/x/..;/otp", "/a%252Fb", "/%2e%2e%2f..;x/"} {
		f.Add(s, false, false, true, uint8(0))
		f.Add(s, true, true, false, uint8(1))
	}
	f.Fuzz(func(t *testing.T, p string, keep, fold, decode bool, params uint8) {
		if !strings.HasPrefix(p, "/") {
			return
		}
		o := PathOptions{KeepTrailingSlash: keep, CaseSensitive: fold, DecodeSeparators: decode, Params: ParamMode(params % 3)}
		n, ok := o.Normalize(p)
		if !ok {
			return
		}
		if again, ok := o.Normalize(n); again != n || !ok {
			t.Fatalf("Normalize(%q) = %q, but Normalize of that is %q, %v", p, n, again, ok)
		}
		if hasSeparator(n) || o.Params != ParamsKeep && strings.Contains(n, ";") {
			t.Fatalf("Normalize(%q) = %q keeps what servers read in different ways", p, n)
		}
		if !strings.HasPrefix(n, "/") || strings.Contains(n, "//") {
			t.Fatalf("Normalize(%q) = %q", p, n)
		}
		for seg := range strings.SplitSeq(n[1:], "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("Normalize(%q) = %q keeps a dot segment", p, n)
			}
		}
	})
}

// Exactly the unreserved characters are decoded, at every edge of their
// ranges; every other escape is kept with upper-case hex, and malformed ones
// as they are.
func TestNormalizeDecodesExactlyTheUnreserved(t *testing.T) {
	var o PathOptions
	for c := 0; c < 256; c++ {
		in := "/x" + "%" + strings.ToLower(hex2(c)) + "y"
		got, _ := o.Normalize(in)
		ch := byte(c)
		unres := 'a' <= ch && ch <= 'z' || 'A' <= ch && ch <= 'Z' || '0' <= ch && ch <= '9' || ch == '-' || ch == '.' || ch == '_' || ch == '~'
		want := "/x%" + hex2(c) + "y"
		if unres {
			want = "/x" + string(rune(ch)) + "y"
		}
		if ch == '/' || ch == '\\' {
			want = "" // refused: TestNormalizeRefusesWhatServersReadDifferently
		}
		if got != want {
			t.Errorf("Normalize(%q) = %q, want %q", in, got, want)
		}
	}
	for _, bad := range []string{"/a%g1", "/a%1g", "/a%G1", "/a%:1", "/a%/1", "/a%", "/a%4", "/50%", "/%zz", "/%7%30"} {
		if got, ok := o.Normalize(bad); ok {
			t.Errorf("Normalize(%q) = %q: a malformed escape must be refused", bad, got)
		}
	}
	for in, want := range map[string]string{"/a/.": "/a", "/a/..": "/", "/.a/..b": "/.a/..b", "/a/...": "/a/...", "/": "/", "/a/": "/a"} {
		if got, _ := o.Normalize(in); got != want {
			t.Errorf("Normalize(%q) = %q, want %q", in, got, want)
		}
	}
}

func hex2(c int) string {
	return strings.ToUpper(string("0123456789abcdef"[c>>4]) + string("0123456789abcdef"[c&15]))
}

// Rules match paths in any case by default, and in their own when the
// paths section says caseInsensitive: false; a refusal says what it
// refuses.
func TestPathsMatchInAnyCaseByDefault(t *testing.T) {
	for _, tc := range []struct {
		src, path string
		want      bool
	}{
		{"", "/OTP", true},
		{"", "/Otp/", true},
		{"", "/otp", true},
		{"paths: {caseInsensitive: false}\n", "/OTP", false},
		{"paths: {caseInsensitive: false}\n", "/otp", false},
		{"paths: {caseInsensitive: false}\n", "/Otp", true},
		{"paths: {caseInsensitive: true}\n", "/oTp", true},
	} {
		c, err := Parse("case.yaml", []byte(tc.src+"rules:\n  - {id: a, match: {path: /Otp}, key: [ip], rate: 1, per: 1s}\n"))
		if err != nil {
			t.Fatal(err)
		}
		n, _ := c.Paths.Normalize(tc.path)
		if _, got := c.Rules[0].Match.Matches("GET", "", c.Paths.MatchForm(n)); got != tc.want {
			t.Errorf("%q against /Otp with %q: %v, want %v", tc.path, tc.src, got, tc.want)
		}
	}
	for in, want := range map[string]string{"/otp%zz": "malformed percent-escape", "/%2Fotp": "encoded slash", "/a\\b": "backslash"} {
		if why := (PathOptions{}).Why(in); !strings.Contains(why, want) {
			t.Errorf("Why(%q) = %q, want it to say %q", in, why, want)
		}
	}
	if why := (PathOptions{Params: ParamsReject}).Why("/otp;a"); !strings.Contains(why, "path parameter") {
		t.Errorf("Why(/otp;a) = %q", why)
	}
}
