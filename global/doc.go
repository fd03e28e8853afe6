// Package global keeps one limit across regions, each deciding on its own
// store.
//
// Each region holds a share of the limit (thousandths, algo.Whole being all
// of it) and decides alone, exactly, on its part: a token bucket of the
// share's size (algo.Portion), in its own store. The regions move shares
// to where demand is through a coordinator (Options.Exchange), whose state
// lives in one store that every region reaches (the home store). The
// promise rests on one invariant: at every instant, the shares the regions
// may be holding add up to at most the capacity (Whole, or Whole·(1+b)
// where an operator allows borrowing b); algo.Portion turns it into the
// bound over any interval, since no change of share makes tokens.
//
// How the invariant holds without clocks that agree. A region exchanges
// with the coordinator (Options.Exchange) through its agent (Agent), one
// request at a time: it declares the share it holds now, with what it needs, and applies the grant in the
// answer only if the answer comes while it still waits for it. Shares
// above the region's own (a lease) end by themselves: the region counts a
// lease from when it sent its request, on its own clock, and the
// coordinator from when it received it, on the home store's clock; the
// request was sent before it was received, so the region's lease ends
// first. Only durations are compared within each clock; no two clocks are
// compared. The coordinator counts for each region the larger of what it
// declared (until the lease that gave it would end) and what it was last
// granted (until that lease would end): whichever of the two the region
// holds, and a region that never exchanged holds its own share. It grants
// only from what no region may be holding. A region gives up a share
// before it says so (it declares what it already holds), so a release is
// free at once; a region the coordinator asks to shrink does so when the
// answer comes, and says so at once in a new exchange.
//
// What a cut-off region does: it keeps what it holds below its own share,
// and its lease ends within the lease's time (LeaseFor), after which it
// holds its own share less what it lent (its floor); the coordinator gives
// the lease to others only once it has ended on the coordinator's count.
// When it returns it holds no more than that, and its first exchange says
// so: nothing is admitted twice.
//
// The package holds the protocol's decisions, on the numbers a store
// keeps (the parts, the coordinator's accounts), and the Runner that a
// serving process runs with them: it counts the demand of its decisions
// (Demand), pools it in its region's store, and, while it leads its
// region, exchanges with the home (Pool, Home). The simulator (package
// sim, `sluice simulate regions`) runs the same decisions over links with
// latency, cuts and clocks apart, and its seeded property tests hold them
// to the bound.
package global
