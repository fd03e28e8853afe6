package sim

import (
	"cmp"
	"slices"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice"
)

// RaceMethod is one counting method's outcome in the race scenario.
type RaceMethod struct {
	Method       string         `json:"method"`
	Admitted     int            `json:"admitted"`
	OverLimit    int            `json:"overLimit"`
	FinalCounter int            `json:"finalCounter"`
	PerNode      map[string]int `json:"perNode"`
}

// RaceResult is the JSON form of the race scenario.
type RaceResult struct {
	Methods []RaceMethod `json:"methods"`
}

type raceRequest struct {
	t, rtt float64 // ms
	node   string
}

func raceRequests() []raceRequest {
	rng := NewMulberry32(99)
	reqs := make([]raceRequest, 1000)
	for i := range reqs {
		t := rng.Float64() * 200
		node := "A"
		if rng.Float64() >= 0.5 {
			node = "B"
		}
		reqs[i] = raceRequest{t: t, node: node, rtt: 1 + 2*rng.Float64()}
	}
	return reqs
}

// raceEvent is a read (a request starts) or a write (its write lands at the
// shared store after the round trip).
type raceEvent struct {
	t     float64
	i     int
	write bool
}

// Race shows why a remote counter needs an atomic step: two gateways share a
// counter with limit 100; 1,000 requests over 200 ms, each a read at t and a
// write landing at t + rtt. get-then-set and get-then-incr (check the value
// read, then write) let far more than 100 through; an atomic INCR, and
// sluice's atomic take, admit exactly 100. The non-atomic methods are a model
// of a remote store's round trips, not sluice code.
func Race() (*Report, error) {
	const limit = 100
	reqs := raceRequests()
	var events []raceEvent
	for i, r := range reqs {
		events = append(events, raceEvent{r.t, i, false}, raceEvent{r.t + r.rtt, i, true})
	}
	slices.SortStableFunc(events, func(a, b raceEvent) int { return cmp.Compare(a.t, b.t) })

	model := func(name string, atRead func(counter *int, read []int, i int) bool, atWrite func(counter *int, read []int, i int) bool) RaceMethod {
		m := RaceMethod{Method: name, PerNode: map[string]int{"A": 0, "B": 0}}
		counter, read := 0, make([]int, len(reqs))
		for _, e := range events {
			f := atRead
			if e.write {
				f = atWrite
			}
			if f != nil && f(&counter, read, e.i) {
				m.Admitted++
				m.PerNode[reqs[e.i].node]++
			}
		}
		m.FinalCounter = counter
		return m
	}
	getThenSet := model("get-then-set",
		func(c *int, read []int, i int) bool { read[i] = *c; return false },
		func(c *int, read []int, i int) bool {
			if read[i] >= limit {
				return false
			}
			*c = read[i] + 1
			return true
		})
	getThenIncr := model("get-then-incr",
		func(c *int, read []int, i int) bool { read[i] = *c; return false },
		func(c *int, read []int, i int) bool {
			if read[i] >= limit {
				return false
			}
			*c++
			return true
		})
	atomicIncr := model("atomic-incr",
		func(c *int, _ []int, _ int) bool { *c++; return *c <= limit }, nil)

	lim, clock, err := newLimiter("race", sluice.Limit{Rate: limit, Period: time.Hour, Algorithm: sluice.FixedWindow})
	if err != nil {
		return nil, err
	}
	sl := RaceMethod{Method: "sluice", PerNode: map[string]int{"A": 0, "B": 0}}
	for _, e := range events {
		if e.write {
			continue
		}
		clock.Set(at(e.t / 1000))
		if d, _ := lim.Take("shared", 1); d.Allowed {
			sl.Admitted++
			sl.PerNode[reqs[e.i].node]++
		}
	}
	d, _ := lim.Take("shared", 0)
	sl.FinalCounter = int(limit - d.Remaining)

	res := RaceResult{Methods: []RaceMethod{getThenSet, getThenIncr, atomicIncr, sl}}
	rep := &Report{
		Title:   "race: two gateways share one counter, limit 100; 1,000 requests in 200 ms, round trips of 1-3 ms; seed 99",
		Columns: []string{"method", "admitted", "over limit", "final counter", "via A", "via B"},
		Chart:   &Chart{Y: []string{"admitted", "over limit"}, YLabel: "requests"},
		JSON:    &res,
	}
	for i := range res.Methods {
		m := &res.Methods[i]
		m.OverLimit = max(0, m.Admitted-limit)
		name := m.Method
		if name != "sluice" {
			name += " (remote store model)"
		}
		rep.Rows = append(rep.Rows, []string{name, strconv.Itoa(m.Admitted), strconv.Itoa(m.OverLimit),
			strconv.Itoa(m.FinalCounter), strconv.Itoa(m.PerNode["A"]), strconv.Itoa(m.PerNode["B"])})
	}
	rep.Notes = append(rep.Notes, "The remote models replay reads and writes in time order; sluice is the real embedded store, one atomic take per request.")
	return rep, nil
}

// SharedVsLocalResult is the JSON form of the shared-vs-local scenario.
type SharedVsLocalResult struct {
	Shared []bool `json:"shared"`
	Local  []bool `json:"local"`
}

// SharedVsLocal shows why gateways must share a count: a sliding log of 5
// per 10 s, 8 requests at t = 0..7 s spread round-robin over 3 servers. One
// shared store admits the first 5; a store per server admits all 8.
func SharedVsLocal() (*Report, error) {
	l := sluice.Limit{Rate: 5, Period: 10 * time.Second, Algorithm: sluice.SlidingLog}
	shared, sharedClock, err := newLimiter("shared", l)
	if err != nil {
		return nil, err
	}
	type server struct {
		lim   interface{ Allow(string) bool }
		clock *sluice.ManualClock
	}
	var locals [3]server
	for i := range locals {
		lim, clock, err := newLimiter("local", l)
		if err != nil {
			return nil, err
		}
		locals[i] = server{lim, clock}
	}
	res := SharedVsLocalResult{}
	rep := &Report{
		Title:   "shared-vs-local: sliding log 5 per 10 s; 8 requests at t = 0..7 s, round-robin over servers A, B, C",
		Columns: []string{"t (s)", "server", "shared store", "store per server"},
		Chart:   &Chart{Y: []string{"shared store", "store per server"}, YLabel: "allowed (1) or rejected (0)"},
		JSON:    &res,
	}
	for t := range 8 {
		sharedClock.Set(at(float64(t)))
		s := &locals[t%3]
		s.clock.Set(at(float64(t)))
		a, b := shared.Allow("client"), s.lim.Allow("client")
		res.Shared = append(res.Shared, a)
		res.Local = append(res.Local, b)
		rep.Rows = append(rep.Rows, []string{strconv.Itoa(t), string(rune('A' + t%3)), verdict(a), verdict(b)})
	}
	rep.Notes = append(rep.Notes, "With a store per server the client gets 8 through a limit of 5: N servers let up to N times the limit through.")
	return rep, nil
}
