package sim

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
	"go.yaml.in/yaml/v3"
)

// CustomSpec is a user's own scenario: traffic (a Poisson background and
// bursts, from a seed) and the limits, or a whole rule file, to compare.
type CustomSpec struct {
	Seed       uint32        `yaml:"seed"`
	Duration   time.Duration `yaml:"-"`
	Background float64       `yaml:"background"` // requests per second
	Bursts     []Burst       `yaml:"-"`
	Limits     []sluice.Limit
	// Rules, when set, replaces Limits: every request goes through the
	// engine with these rules, as one client.
	Rules *rules.Config
}

// Burst is size requests spread uniformly over Spread from At.
type Burst struct {
	At     time.Duration
	Size   int
	Spread time.Duration
}

// customFile is the YAML form of a CustomSpec.
type customFile struct {
	Seed       uint32  `yaml:"seed"`
	Duration   string  `yaml:"duration"`
	Background float64 `yaml:"background"`
	Bursts     []struct {
		At     string `yaml:"at"`
		Size   int    `yaml:"size"`
		Spread string `yaml:"spread"`
	} `yaml:"bursts"`
	Limits []struct {
		Algorithm string `yaml:"algorithm"`
		Rate      int64  `yaml:"rate"`
		Per       string `yaml:"per"`
		Burst     int64  `yaml:"burst"`
	} `yaml:"limits"`
	Rules string `yaml:"rules"`
}

// LoadCustom reads a scenario file.
func LoadCustom(path string) (*CustomSpec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f customFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	spec := &CustomSpec{Seed: f.Seed, Background: f.Background}
	if spec.Duration, err = ParseDuration(f.Duration, 10*time.Second); err != nil {
		return nil, fmt.Errorf("%s: duration: %w", path, err)
	}
	for i, b := range f.Bursts {
		at, err1 := ParseDuration(b.At, 0)
		spread, err2 := ParseDuration(b.Spread, 0)
		if err := cmpErr(err1, err2); err != nil {
			return nil, fmt.Errorf("%s: bursts[%d]: %w", path, i, err)
		}
		spec.Bursts = append(spec.Bursts, Burst{At: at, Size: b.Size, Spread: spread})
	}
	for i, l := range f.Limits {
		a, err := sluice.ParseAlgorithm(l.Algorithm)
		if l.Algorithm == "" {
			a, err = sluice.GCRA, nil
		}
		per, err2 := sluice.ParsePeriod(l.Per)
		if err := cmpErr(err, err2); err != nil {
			return nil, fmt.Errorf("%s: limits[%d]: %w", path, i, err)
		}
		spec.Limits = append(spec.Limits, sluice.Limit{Rate: l.Rate, Period: per, Burst: l.Burst, Algorithm: a})
	}
	if f.Rules != "" {
		// A relative path is the scenario file's neighbour, wherever
		// sluice runs from, as include paths are in most tools.
		rp := f.Rules
		if !filepath.IsAbs(rp) {
			rp = filepath.Join(filepath.Dir(path), rp)
		}
		if spec.Rules, err = rules.Load(rp); err != nil {
			return nil, err
		}
	}
	return spec, nil
}

func cmpErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// ParseDuration reads a duration in sluice's period syntax ("500ms", "2s")
// or Go's ("1.5s"); "" gives def.
func ParseDuration(s string, def time.Duration) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	if d, err := sluice.ParsePeriod(s); err == nil {
		return d, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q is not a duration", s)
	}
	return d, nil
}

// Arrivals draws the spec's traffic: the background as a Poisson process
// (exponential gaps), then each burst, sorted.
func (s *CustomSpec) Arrivals() []time.Duration {
	rng := NewMulberry32(s.Seed)
	var ts []time.Duration
	if s.Background > 0 {
		for t := 0.0; ; {
			t += -math.Log(1-rng.Float64()) / s.Background
			d := time.Duration(t * float64(time.Second))
			if d >= s.Duration {
				break
			}
			ts = append(ts, d)
		}
	}
	for _, b := range s.Bursts {
		for range b.Size {
			ts = append(ts, b.At+time.Duration(rng.Float64()*float64(b.Spread)))
		}
	}
	slices.Sort(ts)
	return ts
}

// CustomSecond is one second of a custom run.
type CustomSecond struct {
	Second int           `json:"second"`
	In     int           `json:"in"`
	Limits []CustomCount `json:"limits"`
}

// CustomCount is one limit's (or rule's) outcome within a second.
type CustomCount struct {
	Name     string `json:"name"`
	Allowed  int    `json:"allowed"`
	Rejected int    `json:"rejected"`
}

// CustomResult is the JSON form of a custom run.
type CustomResult struct {
	Seconds []CustomSecond `json:"seconds"`
	Totals  []CustomCount  `json:"totals"`
}

// Custom runs a user's scenario through the embedded store (or, with a rule
// file, the engine) under a simulated clock.
func Custom(spec *CustomSpec) (*Report, error) {
	if spec.Duration <= 0 {
		spec.Duration = 10 * time.Second
	}
	type runner struct {
		name string
		take func(k int, at time.Time) (allowed, applied bool) // the k-th arrival, at an instant
	}
	var runners []runner
	if spec.Rules != nil {
		clock := sluice.NewManualClock(base)
		eng, err := engine.New(spec.Rules, engine.Options{Store: memory.New(memory.WithClock(clock))})
		if err != nil {
			return nil, err
		}
		req := &rules.Request{Method: "GET", Path: "/", Host: "sim", ClientIP: netip.MustParseAddr("192.0.2.1"),
			Header: http.Header{"X-User-Id": {"sim"}, "X-Tenant-Id": {"sim"}, "Authorization": {"Bearer sim"}}}
		var res engine.Result
		checked := -1
		for _, r := range spec.Rules.Rules {
			id := r.ID
			runners = append(runners, runner{name: id, take: func(k int, at time.Time) (bool, bool) {
				if checked != k { // one check per arrival, shared by its rules
					checked = k
					clock.Set(at)
					eng.Check(context.Background(), req, engine.CheckOptions{}, &res)
				}
				for _, st := range res.Statuses {
					if st.Rule == id {
						return st.Allowed, true
					}
				}
				return false, false // the rule does not apply to the simulated client's requests
			}})
		}
	}
	for _, l := range spec.Limits {
		lim, clock, err := newLimiter(l.String(), l)
		if err != nil {
			return nil, err
		}
		runners = append(runners, runner{name: l.String(), take: func(_ int, at time.Time) (bool, bool) {
			clock.Set(at)
			return lim.Allow("sim"), true
		}})
	}
	if len(runners) == 0 {
		return nil, fmt.Errorf("sim: a custom scenario needs limits or a rule file")
	}
	secs := int((spec.Duration + time.Second - 1) / time.Second)
	res := CustomResult{Seconds: make([]CustomSecond, secs), Totals: make([]CustomCount, len(runners))}
	for i := range res.Seconds {
		res.Seconds[i].Second = i
		res.Seconds[i].Limits = make([]CustomCount, len(runners))
		for j, r := range runners {
			res.Seconds[i].Limits[j].Name = r.name
			res.Totals[j].Name = r.name
		}
	}
	arrivals := spec.Arrivals()
	for k, t := range arrivals {
		if t >= spec.Duration {
			continue
		}
		sec := &res.Seconds[int(t/time.Second)]
		sec.In++
		for j, r := range runners {
			switch allowed, applied := r.take(k, base.Add(t)); {
			case !applied:
			case allowed:
				sec.Limits[j].Allowed++
				res.Totals[j].Allowed++
			default:
				sec.Limits[j].Rejected++
				res.Totals[j].Rejected++
			}
		}
	}
	rep := &Report{Title: fmt.Sprintf("custom: seed %d, %v, background %.3g/s, %d bursts", spec.Seed, spec.Duration, spec.Background, len(spec.Bursts)), JSON: &res}
	rep.Columns = []string{"second", "in"}
	rep.Chart = &Chart{Lines: true, X: "second", Y: []string{"in"}, YLabel: "requests per second"}
	seen := map[string]int{}
	for _, r := range runners {
		// Every column its own name: a limit given twice is told apart.
		name := r.name
		if seen[name]++; seen[name] > 1 {
			name = fmt.Sprintf("%s (#%d)", name, seen[name])
		}
		rep.Columns = append(rep.Columns, name+" allowed", name+" rejected")
		rep.Chart.Y = append(rep.Chart.Y, name+" allowed")
	}
	for _, s := range res.Seconds {
		row := []string{strconv.Itoa(s.Second), strconv.Itoa(s.In)}
		for _, c := range s.Limits {
			row = append(row, strconv.Itoa(c.Allowed), strconv.Itoa(c.Rejected))
		}
		rep.Rows = append(rep.Rows, row)
	}
	return rep, nil
}
