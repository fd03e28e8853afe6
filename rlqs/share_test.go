package rlqs

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testkit/rlqstest"
)

const sharedRule = `rules:
  - id: shared
    envoy: {domain: quota, descriptors: [{key: name, value: shared}]}
    rate: 100
    per: 10s
`

// The bar: four Envoys on one bucket limited to 100 per 10 s, demand moved
// among them, one leaving (it goes on enforcing its last assignment until
// the TTL), one joining late. Over every 10 s the four admit at most 100
// plus the bursts of the buckets they held or were handed in it (each
// grant's max_tokens, as Envoy starts a replaced bucket full), and each busy
// Envoy has its share from one report interval after demand moved.
func TestFourEnvoysShareOneLimitAsDemandMoves(t *testing.T) {
	moveDemand(t, newQuotaTest(t, sharedRule, Options{}), func(string) int { return 0 }, 0.8)
}

// The same four Envoys, a and c reporting to one process, b and d to
// another, on one store whose claims both read: the limit is divided among
// the processes by their claims, so the bound over every 10 s is the same,
// and each busy Envoy has at least half of its share (a process's idle
// members' floors are its own, so shares differ from one process's).
func TestFourEnvoysOnTwoProcessesShareOneLimit(t *testing.T) {
	q := newFleetTest(t, sharedRule, Options{}, 2)
	moveDemand(t, q, func(name string) int { return map[string]int{"a": 0, "c": 0, "b": 1, "d": 1}[name] }, 0.5)
}

// moveDemand runs the four Envoys' script, each on the process place names,
// and holds them to the bound and to part of their shares.
func moveDemand(t *testing.T, q *quotaTest, place func(string) int, part float64) {
	bucket := map[string]string{"name": "shared"}
	const (
		step   = 10 * time.Millisecond
		rate   = 10.0 // the rule's, a second
		busy   = 40.0
		idle   = 0.5
		window = 10 * time.Second
	)
	names := []string{"a", "b", "c", "d"}
	envoys := map[string]*rlqstest.Envoy{}
	for _, n := range names {
		envoys[n] = q.envoyOn(place(n), n, "quota", bucket)
	}
	// Who is busy when, by whole seconds; c leaves at 60 s.
	busyAt := func(name string, sec int) bool {
		switch name {
		case "a":
			return sec < 20 || sec >= 40 && sec < 60
		case "b":
			return sec >= 20
		case "c":
			return sec >= 40 && sec < 62 // after leaving, it still sends traffic
		default:
			return sec >= 70
		}
	}
	type phase struct {
		from, to int
		share    float64 // each busy Envoy's: the rate less the idle members' floors
	}
	// What sluice divides (the rule's rate less the part kept back), and
	// an idle member's floor in a bucket of n members.
	div := rate * (1 - keptBack)
	floor := func(n float64) float64 { return div / (4 * n) }
	phases := []phase{
		{0, 20, div - 3*floor(4)},
		{20, 40, div - 3*floor(4)},
		{40, 60, (div - floor(4)) / 3},
		{62, 70, div - 2*floor(3)},     // c left: three members
		{70, 80, (div - floor(3)) / 2}, // b and d busy, a idle
	}
	offsets := map[string]time.Duration{"a": 0, "b": 250 * time.Millisecond, "c": 500 * time.Millisecond, "d": 750 * time.Millisecond}
	start := q.clock.Now()
	acc := map[string]float64{}
	for _, n := range names {
		envoys[n].Report() // a new bucket is reported at once
	}
	q.settle()
	for i := 1; i <= int(80*time.Second/step); i++ {
		q.clock.Advance(step)
		el := time.Duration(q.clock.Now() - start)
		sec := int(el / time.Second)
		if el == 60*time.Second {
			q.leave(envoys["c"])
		}
		for _, n := range names {
			d := idle
			if busyAt(n, sec) {
				d = busy
			}
			for acc[n] += d * step.Seconds(); acc[n] >= 1; acc[n]-- {
				envoys[n].Request()
			}
		}
		reported := false
		for _, n := range names {
			if (el-offsets[n])%time.Second == 0 && el >= offsets[n] {
				envoys[n].Report()
				reported = true
			}
		}
		if reported {
			q.settle()
		}
	}

	// Every 10 s, against 100 plus the bursts.
	var es []*rlqstest.Envoy
	for _, n := range names {
		es = append(es, envoys[n])
	}
	w := rlqstest.Windows(es, start, q.clock.Now(), window, step, rate*window.Seconds(), 0)
	if w.Over != "" {
		t.Fatalf("over 100 plus the bursts: %s", w.Over)
	}
	t.Logf("most admitted in any 10 s: %.0f (bursts in it: %.0f)", w.Most, w.Bursts)

	// Each busy Envoy its share, in every 2 s from a second after demand moved.
	for _, p := range phases {
		for from := p.from + 1; from+2 <= p.to; from += 2 {
			for _, name := range names {
				if !busyAt(name, from) || name == "c" && from >= 60 {
					continue
				}
				n := 0
				for _, at := range envoys[name].Admitted() {
					if el := time.Duration(at - start); el >= time.Duration(from)*time.Second && el < time.Duration(from+2)*time.Second {
						n++
					}
				}
				if want := part * p.share * 2; float64(n) < want {
					t.Errorf("%s admitted %d in [%ds, %ds), want at least %.1f (%.0f%% of a share of %.2f/s)", name, n, from, from+2, want, 100*part, p.share)
				}
			}
		}
	}
	st := q.stats()
	t.Logf("%+v", st)
}
