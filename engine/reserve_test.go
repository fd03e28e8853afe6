package engine

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

const reserveRules = `
keys:
  user: {header: X-User-Id}
rules:
  - id: tpm
    key: [user]
    rate: 1000
    per: 1m
    reserve: {estimate: 100, deadline: 30s}
  - id: rpm
    key: [user]
    rate: 60
    per: 1m
`

func (f *fixture) reserve(t *testing.T, user string, estimate int64) *Result {
	t.Helper()
	var res Result
	if err := f.e.Check(context.Background(), userReq(user), CheckOptions{Reserve: true, Estimate: estimate}, &res); err != nil {
		t.Fatal(err)
	}
	return &res
}

func (f *fixture) settle(t *testing.T, id string, actual int64) []Settled {
	t.Helper()
	out, err := f.e.Settle(context.Background(), id, actual)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (f *fixture) remaining(t *testing.T, rule, key string) int64 {
	t.Helper()
	d, _, err := f.e.Inspect(context.Background(), rule, key)
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

// The token rule reserves the estimate and settles at the real cost, both
// ways; the request rule counts one per request and is not settled.
func TestReserveThenSettleChargesTheRealCost(t *testing.T) {
	f := newFixture(t, reserveRules, Options{})
	res := f.reserve(t, "u1", 0) // the rule's estimate: 100
	if !res.Allowed || res.Reservation == "" || res.ReservationDeadline.IsZero() {
		t.Fatalf("reserve: %+v", res)
	}
	if got := f.remaining(t, "tpm", "u1"); got != 900 {
		t.Fatalf("after reserving 100: %d left, want 900", got)
	}
	out := f.settle(t, res.Reservation, 40)
	if len(out) != 1 || out[0].Rule != "tpm" || !out[0].Allowed || out[0].Key != "u1" {
		t.Fatalf("settle: %+v", out)
	}
	if got := f.remaining(t, "tpm", "u1"); got != 960 {
		t.Fatalf("settled at 40: %d left, want 960", got)
	}
	if got := f.remaining(t, "rpm", "u1"); got != 59 {
		t.Fatalf("the request rule: %d left, want 59 (not settled)", got)
	}
	if out := f.settle(t, res.Reservation, 0); out[0].Allowed || out[0].Reason != sluice.ReasonNoReservation {
		t.Fatalf("a second settle: %+v", out)
	}

	// Under-estimated: 900 reserved, 1500 used: 560 owed beyond empty.
	res = f.reserve(t, "u1", 900)
	if !res.Allowed {
		t.Fatalf("reserve 900 of 960: %+v", res.Decision)
	}
	f.settle(t, res.Reservation, 1500)
	if res := f.reserve(t, "u1", 1); res.Allowed || res.Decision.RetryAfter != 541*60*time.Millisecond {
		t.Fatalf("in debt of 540: %+v, want refused for 541 tokens at 60ms", res.Decision)
	}

	// Not settled within the deadline: the estimate stands.
	res = f.reserve(t, "u2", 300)
	f.clock.Advance(31 * time.Second)
	before := f.remaining(t, "tpm", "u2")
	if out := f.settle(t, res.Reservation, 0); out[0].Reason != sluice.ReasonNoReservation {
		t.Fatalf("a late settle: %+v", out)
	}
	if got := f.remaining(t, "tpm", "u2"); got != before {
		t.Fatalf("a late settle changed the key: %d, was %d", got, before)
	}
	st := f.e.Stats()
	if st[0].Settled != 2 || st[0].Unsettled != 2 {
		t.Errorf("settle counts: %+v", st[0])
	}
}

// A refused request opens nothing; a refunded one closes its reservation;
// a check without Reserve takes the estimate for good.
func TestReservationsOnlyForAdmittedRequests(t *testing.T) {
	f := newFixture(t, reserveRules, Options{})
	for range 60 {
		f.reserve(t, "u3", 1)
	}
	res := f.reserve(t, "u3", 5) // the request rule is spent
	if res.Allowed || res.Reservation != "" {
		t.Fatalf("a refused request: %+v", res)
	}
	g := newFixture(t, reserveRules, Options{})
	res = g.reserve(t, "u4", 200)
	g.e.Refund(context.Background(), res)
	if got := g.remaining(t, "tpm", "u4"); got != 1000 {
		t.Fatalf("refunded: %d left", got)
	}
	if out := g.settle(t, res.Reservation, 0); out[0].Reason != sluice.ReasonNoReservation {
		t.Fatalf("a refunded reservation settled: %+v", out)
	}
	var plain Result
	g.e.Check(context.Background(), userReq("u5"), CheckOptions{}, &plain)
	if plain.Reservation != "" || g.remaining(t, "tpm", "u5") != 900 {
		t.Fatalf("a plain check: reservation %q, %d left", plain.Reservation, g.remaining(t, "tpm", "u5"))
	}
}

// Ids are opaque and unforgeable: garbage is an error, and an id edited to
// name another user's key settles nothing there.
func TestForgedReservationsSettleNothing(t *testing.T) {
	f := newFixture(t, reserveRules, Options{})
	f.reserve(t, "victim", 500)
	mine := f.reserve(t, "me", 500)
	nonce := append([]byte{1}, make([]byte, 16)...)
	cut := append(slices.Clone(nonce), 2, 'x')   // a length one past the id
	endless := append(slices.Clone(nonce), 0x80) // a length that never ends
	for _, bad := range []string{"", "!!", "AQ", base64.RawURLEncoding.EncodeToString(make([]byte, 40)), string(make([]byte, MaxReservationLen+1)),
		base64.RawURLEncoding.EncodeToString(cut), base64.RawURLEncoding.EncodeToString(endless)} {
		if _, err := f.e.Settle(context.Background(), bad, 0); !errors.Is(err, ErrBadReservation) {
			t.Errorf("Settle(%.20q): %v, want ErrBadReservation", bad, err)
		}
	}
	// My random part, the victim's key.
	b, _ := base64.RawURLEncoding.DecodeString(mine.Reservation)
	forged := append(b[:17:17], 3, 't', 'p', 'm', 6, 'v', 'i', 'c', 't', 'i', 'm')
	out := f.settle(t, base64.RawURLEncoding.EncodeToString(forged), 0)
	if out[0].Allowed || out[0].Key != "victim" {
		t.Fatalf("a forged id settled: %+v", out)
	}
	if got := f.remaining(t, "tpm", "victim"); got != 500 {
		t.Fatalf("the victim's key changed: %d left", got)
	}
	if _, err := f.e.Settle(context.Background(), mine.Reservation, -1); err == nil {
		t.Fatal("a negative actual was accepted")
	}
}

// A plain check of the two rules, against a check that reserves and its
// settle: what reserve-now-settle-later costs on the embedded store.
func BenchmarkReserveAndSettle(b *testing.B) {
	for _, mode := range []string{"check", "reserve+settle"} {
		b.Run("op="+mode, func(b *testing.B) {
			clock := sluice.NewManualClock(epoch)
			e, err := New(mustRules(b, reserveRules), Options{Store: memory.New(memory.WithClock(clock)), Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			req := userReq("u42")
			var res Result
			ctx := context.Background()
			opt := CheckOptions{Reserve: mode != "check", Estimate: 10}
			for b.Loop() {
				clock.Advance(time.Second)
				e.Check(ctx, req, opt, &res)
				if opt.Reserve {
					e.SettleResult(ctx, &res, func(*rules.Reserve) (int64, bool) { return 7, true })
				}
			}
			if !res.Allowed {
				b.Fatalf("refused: %+v", res.Decision)
			}
		})
	}
}

// The estimate comes from the caller, else the request's header or body
// field (whole numbers above 0), else the rule; the reservation's deadline
// is the first of its rules'.
func TestEstimatesAndDeadlines(t *testing.T) {
	f := newFixture(t, `
keys:
  user: {header: X-User-Id}
rules:
  - {id: a, key: [user], rate: 1000, per: 1h, reserve: {estimate: 100, estimateHeader: X-Estimate, estimateBody: size, deadline: 2m}}
  - {id: b, key: [user], rate: 1000, per: 1h, reserve: {estimate: 7, deadline: 30s}}
`, Options{})
	reserve := func(user, header, body string, est int64) *Result {
		req := userReq(user)
		if header != "" {
			req.Header.Set("X-Estimate", header)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
			req.Body = []byte(body)
		}
		var res Result
		if err := f.e.Check(context.Background(), req, CheckOptions{Reserve: true, Estimate: est}, &res); err != nil {
			t.Fatal(err)
		}
		return &res
	}
	for i, c := range []struct {
		header, body string
		est, want    int64
	}{
		{"", "", 0, 100},
		{"40", "", 0, 40},
		{"", `{"size": 30}`, 0, 30},
		{"40", `{"size": 30}`, 0, 40}, // the header wins
		{"-3", `{"size": "x"}`, 0, 100},
		{"0", `{"size": 0}`, 0, 100},
		{"40", "", 5, 5}, // the caller's wins
	} {
		user := fmt.Sprint("u", i)
		res := reserve(user, c.header, c.body, c.est)
		if got := 1000 - f.remaining(t, "a", user); got != c.want {
			t.Errorf("header %q body %q caller %d: reserved %d, want %d", c.header, c.body, c.est, got, c.want)
		}
		if d := time.Until(res.ReservationDeadline); d > 31*time.Second || d < 29*time.Second {
			t.Errorf("deadline in %v, want the first of 2m and 30s", d)
		}
	}
}
