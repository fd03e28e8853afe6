package server

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// The JSON decision API, whatever the body: 200, 400 or 413 with a body,
// never a 500 or a panic. Run longer with
// go test ./server -run '^$' -fuzz FuzzCheckAPI -fuzztime 60s.
func FuzzCheckAPI(f *testing.F) {
	for _, s := range []string{
		loginCheck,
		`{"attributes":{"phone":"1"},"cost":4611686018427387904}`,
		`{"request":{"path":"//otp/../x?y=1","ip":"::ffff:1.2.3.4","headers":{"X-User-Id":"}{"}}}`,
		`[{"attributes":{"phone":"1"}},{"cost":0}]`,
		`{"attributes":{"phone":"\ud800"}}`,
		"{\"attributes\":{\"phone\":\"\xff\"}}",
		`{"request":{"method":"` + strings.Repeat("A", 300) + `"}}`,
	} {
		f.Add("/v1/check", s)
		f.Add("/v1/check:batch", "["+s+"]")
		f.Add("/v1/charge", s)
	}
	fx := newFixture(f, Options{Loopback: true})
	f.Fuzz(func(t *testing.T, path, body string) {
		switch path {
		case "/v1/check", "/v1/check:batch", "/v1/charge":
		default:
			path = "/v1/check"
		}
		w := fx.do("POST", path, body)
		if w.Code != 200 && w.Code != 400 && w.Code != 413 && w.Code != 503 {
			t.Fatalf("%s %q: status %d %s", path, body, w.Code, w.Body)
		}
		if w.Body.Len() == 0 {
			t.Fatalf("%s %q: empty answer", path, body)
		}
	})
}

// Forward-auth, whatever the forwarding headers say: 200, 400 or 429, never
// a 500 or a panic, for every proxy profile.
func FuzzForwardAuth(f *testing.F) {
	f.Add(uint8(0), "POST", "/login?x=1", "203.0.113.7", "for=9.9.9.9", "1.2.3.4, 5.6.7.8")
	f.Add(uint8(1), "", "", "", "", "")
	f.Add(uint8(2), "get", "//%2e%2E/login", "[::1]:80", `for="[2001:db8::1]"`, "unknown")
	f.Add(uint8(3), "\x00", "http://x/y", "999.1.1.1", "for=", ",,,")
	fixtures := map[AuthProxy]*fixture{}
	for _, p := range []AuthProxy{AuthNginx, AuthTraefik, AuthCaddy, AuthEnvoy} {
		fixtures[p] = newFixture(f, Options{Loopback: true, AuthProxy: p})
	}
	profiles := []AuthProxy{AuthNginx, AuthTraefik, AuthCaddy, AuthEnvoy}
	f.Fuzz(func(t *testing.T, which uint8, method, uri, realIP, fwd, xff string) {
		p := profiles[int(which)%len(profiles)]
		r := httptest.NewRequest("GET", "/v1/auth", nil)
		r.RemoteAddr = "192.0.2.10:4000"
		for k, v := range map[string]string{
			"X-Original-Method": method, "X-Forwarded-Method": method,
			"X-Original-Uri": uri, "X-Forwarded-Uri": uri,
			"X-Real-Ip": realIP, "Forwarded": fwd, "X-Forwarded-For": xff, "X-User-Id": "u1",
		} {
			r.Header[k] = []string{v}
		}
		w := httptest.NewRecorder()
		fixtures[p].srv.ServeHTTP(w, r)
		if w.Code != 200 && w.Code != 400 && w.Code != 429 {
			t.Fatalf("%s: status %d %s", p, w.Code, w.Body)
		}
	})
}
