package rlqs

import "sort"

// divide shares total among claims by water-filling (max-min fairness): no
// claim gets more than it asks, no claim gets less than an equal share
// unless it asks for less. What the claims leave is not handed out: each
// share then depends on its own claim alone, so one Envoy's change of
// demand does not move the others' grants, and the rule keeps the rest for
// whoever else counts against it. The shares never sum above total.
func divide(total float64, claims []float64) []float64 {
	n := len(claims)
	out := make([]float64, n)
	if n == 0 || total <= 0 {
		return out
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return claims[order[a]] < claims[order[b]] })
	left := total
	for k, i := range order {
		level := left / float64(n-k)
		out[i] = min(max(claims[i], 0), level)
		left -= out[i]
	}
	return out
}
