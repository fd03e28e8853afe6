package sim

// Mulberry32 is the small, fast generator the built-in scenarios are
// specified with, so that their traffic is the same in every language and on
// every machine. All arithmetic is on uint32, wrapping.
type Mulberry32 struct{ s uint32 }

// NewMulberry32 seeds a generator.
func NewMulberry32(seed uint32) *Mulberry32 { return &Mulberry32{s: seed} }

// Float64 returns the next draw in [0, 1).
func (m *Mulberry32) Float64() float64 {
	m.s += 0x6D2B79F5
	t := m.s
	t = (t ^ (t >> 15)) * (t | 1)
	t = (t + (t^(t>>7))*(t|61)) ^ t
	return float64(t^(t>>14)) / 4294967296
}
