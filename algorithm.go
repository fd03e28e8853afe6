package sluice

import "fmt"

// Algorithm names one of the seven limiting algorithms. The zero value is GCRA,
// the default for a rule that names none.
type Algorithm uint8

// The algorithms, each exact to its definition in docs/algorithms.md.
const (
	// GCRA is the generic cell rate algorithm: a token bucket kept as one
	// number, the theoretical arrival time.
	GCRA Algorithm = iota
	// TokenBucket keeps tokens and the time of the last refill.
	TokenBucket
	// LeakyMeter is the leaky bucket as a meter (a policer): it admits or
	// rejects exactly as a token bucket does.
	LeakyMeter
	// LeakyQueue is the leaky bucket as a queue (a shaper): admitted requests
	// leave at exactly the rate and carry the delay until they leave.
	LeakyQueue
	// FixedWindow counts per aligned window and resets at each window start.
	FixedWindow
	// SlidingLog keeps the time of every admitted unit within the window.
	SlidingLog
	// SlidingWindow is the sliding window counter: the current window's count
	// plus the previous one's, weighted by how much of it still overlaps.
	SlidingWindow

	numAlgorithms = iota
)

var algorithmNames = [numAlgorithms]string{
	GCRA:          "gcra",
	TokenBucket:   "token-bucket",
	LeakyMeter:    "leaky-meter",
	LeakyQueue:    "leaky-queue",
	FixedWindow:   "fixed-window",
	SlidingLog:    "sliding-log",
	SlidingWindow: "sliding-window",
}

// Algorithms returns every algorithm, in declaration order.
func Algorithms() []Algorithm {
	all := make([]Algorithm, numAlgorithms)
	for i := range all {
		all[i] = Algorithm(i)
	}
	return all
}

// String returns the algorithm's configuration name, such as "token-bucket".
func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// Valid reports whether a is one of the seven algorithms.
func (a Algorithm) Valid() bool { return int(a) < numAlgorithms }

// IsBucket reports whether a belongs to the bucket family, whose capacity is
// the burst: token-bucket, leaky-meter, leaky-queue and gcra.
func (a Algorithm) IsBucket() bool {
	switch a {
	case GCRA, TokenBucket, LeakyMeter, LeakyQueue:
		return true
	}
	return false
}

// ParseAlgorithm returns the algorithm with the given configuration name.
func ParseAlgorithm(name string) (Algorithm, error) {
	for i, n := range algorithmNames {
		if n == name {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("sluice: unknown algorithm %q (want one of %s)", name, algorithmList())
}

func algorithmList() string {
	s := ""
	for i, n := range algorithmNames {
		if i > 0 {
			s += ", "
		}
		s += n
	}
	return s
}

// MarshalText implements encoding.TextMarshaler.
func (a Algorithm) MarshalText() ([]byte, error) {
	if !a.Valid() {
		return nil, fmt.Errorf("sluice: invalid algorithm %d", uint8(a))
	}
	return []byte(a.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (a *Algorithm) UnmarshalText(text []byte) error {
	v, err := ParseAlgorithm(string(text))
	if err != nil {
		return err
	}
	*a = v
	return nil
}
