package sim

// events is a simulation's pending events, the earliest first, for
// container/heap.
type events[E interface{ due() int64 }] []E

func (h events[E]) Len() int           { return len(h) }
func (h events[E]) Less(i, j int) bool { return h[i].due() < h[j].due() }
func (h events[E]) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *events[E]) Push(x any)        { *h = append(*h, x.(E)) }
func (h *events[E]) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
