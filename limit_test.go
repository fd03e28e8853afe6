package sluice

import (
	"errors"
	"testing"
	"time"
)

func TestParseLimit(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Limit
	}{
		{"100/1m", Limit{Rate: 100, Period: time.Minute}},
		{"10/15m", Limit{Rate: 10, Period: 15 * time.Minute}},
		{"5/s", Limit{Rate: 5, Period: time.Second}},
		{" 3 / 10m ", Limit{Rate: 3, Period: 10 * time.Minute}},
		{"1000/1h", Limit{Rate: 1000, Period: time.Hour}},
		{"20/500ms", Limit{Rate: 20, Period: 500 * time.Millisecond}},
		{"1/2d", Limit{Rate: 1, Period: 48 * time.Hour}},
	} {
		got, err := ParseLimit(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseLimit(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseLimitRejectsMalformedInput(t *testing.T) {
	for _, in := range []string{"", "100", "100/", "/1m", "0/1m", "-1/1m", "x/1m", "100/1x", "100/0m", "100/-1m", "100/1.5m", "100/1M", "100/m1", "99999999999999999999/1s", "100/9999999999999d", "2/1ns"} {
		if l, err := ParseLimit(in); err == nil {
			t.Errorf("ParseLimit(%q) = %+v, want an error", in, l)
		}
	}
}

func TestFormatPeriodRoundTrips(t *testing.T) {
	for _, d := range []time.Duration{time.Millisecond, 1500 * time.Millisecond, time.Second, 90 * time.Second, 15 * time.Minute, 2 * time.Hour, 24 * time.Hour, 7 * 24 * time.Hour} {
		s := FormatPeriod(d)
		back, err := ParsePeriod(s)
		if err != nil || back != d {
			t.Errorf("FormatPeriod(%v) = %q, parses back as %v, %v", d, s, back, err)
		}
	}
	if got := FormatPeriod(15 * time.Minute); got != "15m" {
		t.Errorf("FormatPeriod(15m) = %q", got)
	}
}

func TestLimitDefaultsAndString(t *testing.T) {
	l := Limit{Rate: 100, Period: time.Minute}
	if l.Capacity() != 100 || l.Algorithm != GCRA {
		t.Fatalf("zero Burst and Algorithm: capacity %d, algorithm %v; want 100, gcra", l.Capacity(), l.Algorithm)
	}
	if got := l.Interval(); got != 600*time.Millisecond {
		t.Fatalf("Interval = %v, want 600ms", got)
	}
	if got := (Limit{Rate: 3, Period: time.Second}).Interval(); got != 333333334 {
		t.Fatalf("Interval of 3/s = %d, want 333333334 (rounded up)", got)
	}
	l.Burst, l.Algorithm = 20, TokenBucket
	if got := l.String(); got != "100/1m burst=20 token-bucket" {
		t.Fatalf("String = %q", got)
	}
}

func TestValidateWrapsErrInvalidLimit(t *testing.T) {
	err := Limit{Rate: 0, Period: time.Second}.Validate()
	if !errors.Is(err, ErrInvalidLimit) {
		t.Fatalf("Validate error %v does not wrap ErrInvalidLimit", err)
	}
}

func TestAlgorithmNamesRoundTrip(t *testing.T) {
	want := []string{"gcra", "token-bucket", "leaky-meter", "leaky-queue", "fixed-window", "sliding-log", "sliding-window"}
	all := Algorithms()
	if len(all) != len(want) {
		t.Fatalf("%d algorithms, want %d", len(all), len(want))
	}
	for i, a := range all {
		if a.String() != want[i] {
			t.Errorf("algorithm %d is %q, want %q", i, a, want[i])
		}
		var back Algorithm
		if err := back.UnmarshalText([]byte(a.String())); err != nil || back != a {
			t.Errorf("UnmarshalText(%q) = %v, %v", a, back, err)
		}
	}
	if _, err := ParseAlgorithm("leaky-bucket"); err == nil {
		t.Error("ParseAlgorithm accepted an unknown name")
	}
}

func TestManualClockMovesOnlyWhenTold(t *testing.T) {
	c := NewManualClock(time.Unix(100, 0))
	if c.Now() != 100e9 {
		t.Fatalf("Now = %d", c.Now())
	}
	c.Advance(2 * time.Second)
	c.Advance(-time.Second)
	if c.Now() != 101e9 {
		t.Fatalf("after +2s -1s, Now = %d, want 101e9", c.Now())
	}
}

func TestSystemClockIsMonotonic(t *testing.T) {
	c := NewSystemClock()
	prev := c.Now()
	for range 1000 {
		now := c.Now()
		if now < prev {
			t.Fatalf("clock went back from %d to %d", prev, now)
		}
		prev = now
	}
	if d := time.Duration(c.Now() - time.Now().UnixNano()); d > time.Second || d < -time.Second {
		t.Fatalf("system clock is %v away from the wall clock", d)
	}
}

func TestCoarseClockAdvancesAndStops(t *testing.T) {
	c := NewCoarseClock(100 * time.Microsecond)
	start := c.Now()
	deadline := time.Now().Add(5 * time.Second)
	for c.Now() == start {
		if time.Now().After(deadline) {
			t.Fatal("coarse clock did not advance in 5s")
		}
		time.Sleep(time.Millisecond)
	}
	c.Stop()
	c.Stop() // idempotent
	if d := time.Duration(time.Now().UnixNano() - c.Now()); d < -time.Second || d > time.Minute {
		t.Fatalf("coarse clock is %v away from the wall clock", d)
	}
	// Stopped, it no longer ticks: its time stands still.
	stopped := c.Now()
	time.Sleep(20 * time.Millisecond) // 200 of its ticks, had it not stopped
	if c.Now() != stopped {
		t.Fatal("the coarse clock kept ticking after Stop")
	}
}
