package algo

import (
	"math"
	"math/bits"
)

// AddSat returns a+b, saturated to the int64 range.
func AddSat(a, b int64) int64 {
	s := a + b
	if (s > a) != (b > 0) {
		if b > 0 {
			return math.MaxInt64
		}
		return math.MinInt64
	}
	return s
}

// SubSat returns a-b, saturated to the int64 range.
func SubSat(a, b int64) int64 {
	d := a - b
	if (d < a) != (b > 0) {
		if b > 0 {
			return math.MinInt64
		}
		return math.MaxInt64
	}
	return d
}

// ceilDiv returns ceil(a/b) for a >= 0, b > 0.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}

// floorDiv returns floor(a/b) for b > 0 and any a.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// windowStart returns the start of the aligned window of length w holding t,
// saturated at the earliest representable instant.
func windowStart(t, w int64) int64 {
	m := t % w
	if m < 0 {
		m += w
	}
	return SubSat(t, m)
}

// u128 is an unsigned 128-bit integer, for products of two int64 values.
type u128 struct{ hi, lo uint64 }

func mul(a, b int64) u128 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	return u128{hi, lo}
}

func (x u128) add(y u128) u128 {
	lo, c := bits.Add64(x.lo, y.lo, 0)
	return u128{x.hi + y.hi + c, lo}
}

// sub returns x-y; callers ensure x >= y.
func (x u128) sub(y u128) u128 {
	lo, b := bits.Sub64(x.lo, y.lo, 0)
	return u128{x.hi - y.hi - b, lo}
}

func (x u128) less(y u128) bool { return x.hi < y.hi || (x.hi == y.hi && x.lo < y.lo) }

func (x u128) isZero() bool { return x.hi == 0 && x.lo == 0 }

// divCapped returns min(floor(x/d), limit) for d > 0, limit >= 0.
func (x u128) divCapped(d, limit int64) int64 {
	if x.hi >= uint64(d) {
		return limit // the quotient needs more than 64 bits
	}
	q, _ := bits.Div64(x.hi, x.lo, uint64(d))
	if q > uint64(limit) {
		return limit
	}
	return int64(q)
}
