package rlqs

import "sort"

// divide shares total among claims by water-filling (max-min fairness): no
// claim gets more than it asks, no claim gets less than an equal share
// unless it asks for less, and what the claims leave is spread equally over
// all of them. The shares never sum above total.
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
	if left > 0 {
		for i := range out {
			out[i] += left / float64(n)
		}
	}
	return out
}
