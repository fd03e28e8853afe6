package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testkit/nginxtest"
	"github.com/sluice-rl/sluice/internal/testkit/proctest"
	"github.com/sluice-rl/sluice/rules"
)

// The shipped shop rules (examples/shop.yaml), the defaults a user gets,
// and an attacker who wants more than otp-sms's 3 texts in 10 minutes sent
// to a victim's phone: 64 clients at once, each from an address of its
// own, try every way of writing the phone or the path that some server
// reads as the victim's POST /otp. The upstream counts each request whose
// body carries the victim's number, however it is written: exactly the 3
// honest requests reach it; every trick is refused.
func TestShopOTPCannotBeTrickedEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	up := newVictimUpstream(t)
	base, _ := start(t, "gateway", "--config", "../../examples/shop.yaml", "--upstream", up.srv.URL,
		"--listen", "127.0.0.1:0", "--admin-listen", "", "--watch", "0")
	addr := strings.TrimPrefix(base, "http://")

	for i := range 3 {
		if status := otpTrick(t, addr, "127.0.0.1", "honest", honestOTP); status != 200 {
			t.Fatalf("honest request %d: %d", i+1, status)
		}
	}
	statuses := attackOTP(t, addr, 0, func(c int) string { return fmt.Sprintf("127.0.%d.%d", 1+c/200, 2+c%200) })
	if n := up.victim.Load(); n != 3 {
		t.Fatalf("the victim's number reached the upstream %d times, want the 3 honest ones (paths: %v)", n, up.paths())
	}
	t.Logf("64 clients, %d tricks each from its own address: %v; the victim's number reached the upstream 3 times", len(otpTricks), statuses)
}

// The same attack through the shipped nginx snippet in front of `sluice
// serve` (forward-auth). nginx does not pass bodies to forward-auth, so
// otp-sms counts these requests under its fallback key, the client address
// (onMissingKey: fallback, the default): from one address, 3 in all reach
// the upstream, whatever the body or path says.
func TestShopOTPCannotBeTrickedThroughNginxEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	shop, err := os.ReadFile("../../examples/shop.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The snippet's instructions: sluice trusts nginx, on loopback.
	src := strings.Replace(string(shop), "trustedProxies: [10.0.0.0/8]", "trustedProxies: [127.0.0.1/32]", 1)
	rulesPath := filepath.Join(t.TempDir(), "shop.yaml")
	if err := os.WriteFile(rulesPath, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	up := newVictimUpstream(t)
	sluice, _ := startServe(t, "--config", rulesPath)
	base := nginxtest.Start(t, "../../examples/proxies/nginx.conf", strings.TrimPrefix(sluice, "http://"), strings.TrimPrefix(up.srv.URL, "http://"))
	addr := strings.TrimPrefix(base, "http://")

	statuses := attackOTP(t, addr, 3, func(int) string { return "127.0.0.1" })
	// The 3 admitted are whichever tricks came first: the upstream reads
	// the victim's number in most of them, not in every one (a JSON
	// \u-escaped digit, say), so it may count fewer than were admitted.
	if n := up.victim.Load(); statuses[200] != 3 || n > 3 || n < 1 {
		t.Fatalf("through nginx: %d admitted, the victim's number reached the upstream %d times; want 3 admitted, at most 3 to the victim (paths: %v)", statuses[200], n, up.paths())
	}
	t.Logf("64 clients, %d tricks each, through nginx: %v; the victim's number reached the upstream %d times", len(otpTricks), statuses, up.victim.Load())
}

const victimPhone = "8801799999999"

// An OTP request: path, Content-Type and body. The tricks are the ways of
// writing the victim's POST /otp that some server reads as such.
type otpRequest struct{ method, path, contentType, body string }

var honestOTP = otpRequest{"POST", "/otp", "application/json", `{"phone":"` + victimPhone + `"}`}

var otpTricks = func() []otpRequest {
	pad := strings.Repeat(" ", rules.MaxBodyBytes)
	json := func(body string) otpRequest { return otpRequest{"POST", "/otp", "application/json", body} }
	form := func(body string) otpRequest {
		return otpRequest{"POST", "/otp", "application/x-www-form-urlencoded", body}
	}
	path := func(method, p string) otpRequest { return otpRequest{method, p, "application/json", honestOTP.body} }
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.NoCompression)
	zw.Write([]byte(`{"phone":"` + victimPhone + `","x":"&phone=r1&"}`))
	zw.Close()
	utf16 := []byte{0xff, 0xfe}
	for _, c := range honestOTP.body {
		utf16 = append(utf16, byte(c), 0)
	}
	const multipart = "x&phone=r1&\r\n--XyZ\r\nContent-Disposition: form-data; name=\"phone\"\r\n\r\n" + victimPhone + "\r\n--XyZ--\r\n"
	return []otpRequest{
		// Bodies: another content type, another case of the name (Go's
		// encoding/json), a byte order mark, a repeated field (the last
		// wins in PHP, Django and many JSON parsers; qs reads both), the
		// field beyond the first 64 KiB, a form planted in a JSON string,
		// JSON that Python or V8 parse and Go does not, UTF-16, gzip (Express
		// inflates it), a multipart preamble (which a form parser reads and
		// a multipart parser skips), arrays, other spellings of the number.
		{"POST", "/otp", "text/plain", honestOTP.body},
		{"POST", "/otp", "", honestOTP.body},
		json(`{"PHONE":"` + victimPhone + `"}`),
		json(`{"Phone":"` + victimPhone + `"}`),
		json("\ufeff" + honestOTP.body),
		json(`{"phone":"8801700000001","phone":"` + victimPhone + `"}`),
		json(`{"phone":"8801700000001","pHONE":"` + victimPhone + `"}`),
		json(`{"pad":"` + pad + `","phone":"` + victimPhone + `"}`),
		json(`{"a":NaN,"phone":"` + victimPhone + `"}`),
		json(`{"phone":["` + victimPhone + `"]}`),
		json(`{"phone":"+880 1799-999999"}`),
		json(`{"phone":8801799999999}`),
		json(`{"phone":"r1"} {"phone":"` + victimPhone + `"}`),
		{"POST", "/otp", "application/json", string(utf16)},
		{"POST", "/otp", "application/json\r\nContent-Encoding: gzip", gz.String()},
		{"POST", "/otp", "multipart/form-data; boundary=XyZ", multipart},
		{"POST", "/otp", "application/x-www-form-urlencoded", `{"phone":"r1","x":"&phone=` + victimPhone + `&"}`},
		form("phone=8801700000001&phone=" + victimPhone),
		form("phone=" + victimPhone + "&phone=" + victimPhone),
		form("phone=8801700000001&pad=" + pad + "&phone=" + victimPhone),
		form("phone[]=" + victimPhone),
		form("phone=r1;phone=" + victimPhone),
		form("{=1&phone=" + victimPhone),
		form("phone=%2B880%201799%20999999"),
		// From a second review: what PHP, body-parser, Werkzeug and
		// busboy read and Go's parsers do not.
		{"POST", "/otp", "multipart/form-data; boundary=XyZ", "--XyZ\r\nContent-Disposition: form-data; name*=UTF-8''phone; name=\"zzz\"\r\n\r\nr1\r\n--XyZ\r\nContent-Disposition: form-data; name*=UTF-8''x; name=\"phone\"\r\n\r\n" + victimPhone + "\r\n--XyZ--\r\n"},
		{"POST", "/otp", "multipart/form-data; boundary=XyZ", "--XyZ\r\nContent-Disposition: form-data; name=\"phone\"\r\n\r\nr1\r\n--XyZ\r\nContent-Disposition: form-data; name=\"phone\"; junk\r\n\r\n" + victimPhone + "\r\n--XyZ--\r\n"},
		{"POST", "/otp", "multipart/form-data; boundary=XyZ", "--XyZ\r\nContent-Disposition: form-data; name=\"phone\"\r\nContent-Type: text/plain; charset=base64\r\n\r\nODgwMTc5OTk5OTk5OQ==\r\n--XyZ--\r\n"},
		form("phone=r1&+phone=" + victimPhone),
		form("phone=r1&phone%00=" + victimPhone),
		{"POST", "/otp?phone=r1", "application/x-www-form-urlencoded", "\ufeffphone=" + victimPhone},
		{"POST", "/otp?phone=r1", "application/x-www-form-urlencoded x+json", "phone=" + victimPhone},
		json(`{"phone":"８８０１７９９９９９９９９"}`),
		json(`{"phone":8801799999999.5}`),
		// Paths: encoded slashes and backslashes (decoded by nginx and
		// WSGI servers), path parameters (dropped by servlet containers),
		// dot segments, doubled slashes, a method in lower case, another
		// case (Express and ASP.NET route it as /otp).
		path("POST", "/%2Fotp"),
		path("POST", "/x/..%2Fotp"),
		path("POST", "/api%2F..%2Fotp"),
		path("POST", "/x/..%5Cotp"),
		path("POST", "/otp;a=b"),
		path("POST", "/x/..;/otp"),
		path("POST", "/./otp"),
		path("POST", "//otp"),
		path("POST", "/x/../otp"),
		path("post", "/otp"),
		path("POST", "/ot%70"),
		path("POST", "/OTP"),
		path("POST", "/Otp/"),
	}
}()

// attackOTP sends every trick from each of 64 clients at once (client c
// from the loopback address from(c)) and returns the count of each status.
// At most admit tricks may pass; the others must be refused: 400 or 413 for
// what cannot be read one way, 429 naming otp-sms for what is counted.
func attackOTP(t *testing.T, addr string, admit int, from func(c int) string) map[int]int {
	t.Helper()
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	var failed atomic.Bool
	for c := range 64 {
		wg.Go(func() {
			for i := range otpTricks {
				tr := otpTricks[(c+i)%len(otpTricks)]
				status := otpTrick(t, addr, from(c), fmt.Sprintf("attacker-%d", c), tr)
				mu.Lock()
				statuses[status]++
				passed := statuses[200]
				mu.Unlock()
				if status < 400 && (status != 200 || passed > admit) && failed.CompareAndSwap(false, true) {
					t.Errorf("client %d: %s %s (%s) %.80q: %d, want it refused", c, tr.method, tr.path, tr.contentType, tr.body, status)
				}
			}
		})
	}
	wg.Wait()
	return statuses
}

// otpTrick sends r on a connection of its own from the address from, as
// user (a header of its own, so that user-default does not interfere), and
// returns the status. A 429 must name otp-sms.
func otpTrick(t *testing.T, addr, from, user string, r otpRequest) int {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Errorf("dial from %s: %v", from, err)
		return 0
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: shop.test\r\nX-User-ID: %s\r\nX-Tenant-ID: %s\r\nContent-Length: %d\r\nConnection: close\r\n", r.method, r.path, user, user, len(r.body))
	if r.contentType != "" {
		fmt.Fprintf(&b, "Content-Type: %s\r\n", r.contentType)
	}
	b.WriteString("\r\n")
	b.WriteString(r.body)
	go c.Write(b.Bytes()) // a refusal may come before the body is read
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Errorf("%s %s from %s: %v", r.method, r.path, from, err)
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode == 429 && !strings.Contains(resp.Header.Get("RateLimit"), `"otp-sms"`) {
		t.Errorf("%s %s from %s: refused by %q, not otp-sms", r.method, r.path, from, resp.Header.Get("RateLimit"))
	}
	return resp.StatusCode
}

// victimUpstream counts the requests whose body carries the victim's
// number in any form, whatever their path.
type victimUpstream struct {
	srv    *httptest.Server
	victim atomic.Int64
	mu     sync.Mutex
	seen   map[string]int
}

func newVictimUpstream(t *testing.T) *victimUpstream {
	u := &victimUpstream{seen: map[string]int{}}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Header.Get("Content-Encoding") == "gzip" {
			if zr, err := gzip.NewReader(bytes.NewReader(body)); err == nil {
				body, _ = io.ReadAll(zr)
			}
		}
		// The victim's number however it is spelled: percent-escaped, in
		// UTF-16, with "+", spaces and dashes.
		if s, err := url.QueryUnescape(string(body)); err == nil {
			body = []byte(s)
		}
		body = bytes.Map(func(r rune) rune {
			if strings.ContainsRune("\x00 +-()", r) {
				return -1
			}
			return r
		}, body)
		if bytes.Contains(body, []byte(victimPhone)) {
			u.victim.Add(1)
			u.mu.Lock()
			u.seen[r.Method+" "+r.RequestURI]++
			u.mu.Unlock()
		}
		w.Write([]byte("sent\n"))
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *victimUpstream) paths() map[string]int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return maps.Clone(u.seen)
}

// The JSON API of the built binary reads a header or an attribute name in
// any case, one way: two spellings with different values are refused, and
// every spelling of one name is one key. 64 callers at once ask for the
// victim's phone in a spelling of their choice: exactly otp-sms's 3 are
// allowed.
func TestServeAPIReadsEachNameOneWayEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	base, _ := startServe(t, "--config", "../../examples/shop.yaml")
	for _, body := range []string{
		`{"request":{"method":"POST","path":"/otp","headers":{"x-user-id":"a","X-User-Id":"b"}},"attributes":{"phone":"1"}}`,
		`{"request":{"method":"POST","path":"/otp","headers":{"X-User-ID":"a"}},"attributes":{"phone":"1","Phone":"2"}}`,
		`{"request":{"method":"POST","path":"/otp","headers":{"X-Tenant-ID":"t","x-tenant-id":"u"}},"attributes":{"phone":"1"}}`,
	} {
		resp, err := http.Post(base+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(b), "name one") {
			t.Errorf("%s: %d %s %s, want 400 with a problem naming the two spellings", body, resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
	}
	spellings := []string{"phone", "Phone", "PHONE", "pHoNe"}
	var allowed, refused atomic.Int64
	var wg sync.WaitGroup
	for c := range 64 {
		wg.Go(func() {
			body := fmt.Sprintf(`{"request":{"method":"POST","path":"/otp","headers":{"X-User-ID":"u%d","X-Tenant-ID":"t%d"}},"attributes":{%q:%q}}`, c, c, spellings[c%len(spellings)], victimPhone)
			a := postCheck(t, base, "/v1/check", body)
			switch {
			case a.Status == 200 && a.Allowed:
				allowed.Add(1)
			case a.Status == 200 && a.Rule == "otp-sms" && a.Reason == "limited":
				refused.Add(1)
			default:
				t.Errorf("caller %d: %d %.200s", c, a.Status, a.Body)
			}
		})
	}
	wg.Wait()
	if allowed.Load() != 3 || refused.Load() != 61 {
		t.Fatalf("64 callers, the victim's phone spelled 4 ways: %d allowed, %d refused; want 3 and 61", allowed.Load(), refused.Load())
	}
}
