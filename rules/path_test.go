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
		{PathOptions{}, "/a%2fb", "/a%2Fb"},
		{PathOptions{}, "/a%2Fb", "/a%2Fb"},
		{PathOptions{}, "/50%", "/50%"},
		{PathOptions{}, "/%zz", "/%zz"},
		{PathOptions{}, "/%41%7e", "/A~"},
		{PathOptions{}, "/.well-known/x", "/.well-known/x"},
		{PathOptions{}, "/a/.b/..c", "/a/.b/..c"},
		{PathOptions{CaseInsensitive: true}, "/OTP/Verify", "/otp/verify"},
		{PathOptions{}, "/OTP", "/OTP"},
		{PathOptions{}, "*", "*"},
		{PathOptions{}, "", ""},
	} {
		if got := tc.o.Normalize(tc.in); got != tc.want {
			t.Errorf("%+v.Normalize(%q) = %q, want %q", tc.o, tc.in, got, tc.want)
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
		f.Add(s, false, false)
	}
	f.Fuzz(func(t *testing.T, p string, keep, fold bool) {
		if !strings.HasPrefix(p, "/") {
			return
		}
		o := PathOptions{KeepTrailingSlash: keep, CaseInsensitive: fold}
		n := o.Normalize(p)
		if again := o.Normalize(n); again != n {
			t.Fatalf("Normalize(%q) = %q, but Normalize of that is %q", p, n, again)
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
		got := o.Normalize(in)
		ch := byte(c)
		unres := 'a' <= ch && ch <= 'z' || 'A' <= ch && ch <= 'Z' || '0' <= ch && ch <= '9' || ch == '-' || ch == '.' || ch == '_' || ch == '~'
		want := "/x%" + hex2(c) + "y"
		if unres {
			want = "/x" + string(rune(ch)) + "y"
		}
		if got != want {
			t.Errorf("Normalize(%q) = %q, want %q", in, got, want)
		}
	}
	for _, bad := range []string{"/a%g1", "/a%1g", "/a%G1", "/a%:1", "/a%/1", "/a%", "/a%4"} {
		if got := o.Normalize(bad); got != bad {
			t.Errorf("Normalize(%q) = %q: a malformed escape must stay as it is", bad, got)
		}
	}
	for in, want := range map[string]string{"/a/.": "/a", "/a/..": "/", "/.a/..b": "/.a/..b", "/a/...": "/a/...", "/": "/", "/a/": "/a"} {
		if got := o.Normalize(in); got != want {
			t.Errorf("Normalize(%q) = %q, want %q", in, got, want)
		}
	}
}

func hex2(c int) string {
	return strings.ToUpper(string("0123456789abcdef"[c>>4]) + string("0123456789abcdef"[c&15]))
}
