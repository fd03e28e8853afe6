package rlqs

import (
	"math"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A grant is what one Envoy may admit for one bucket: a token bucket that
// starts full at burst tokens and fills at rate, until its TTL ends or a new
// grant replaces it. Every token a grant can hand out is paid for in the
// store before the grant is sent: the burst and the fill up to paidUntil,
// which lies a TTL and the delivery grace past the latest send. So the
// Envoys of a bucket never admit more than the rule admitted to sluice, and
// each admission comes at most TTL + grace after the take that paid for it.
type grant struct {
	kind      kind
	rate      float64 // tokens a second, as Envoy fills them (fill below)
	burst     int64
	paidUntil int64   // ns on the service's clock: the fill is paid to here
	credit    float64 // tokens paid beyond what the grant owes (takes are whole)
	strategy  *typev3.RateLimitStrategy
}

type kind int

const (
	none kind = iota
	allowAll
	denyAll
	tokens
)

// fill writes rate in Envoy's terms, never above it: one token every whole
// number of milliseconds, or up to rate/1000 tokens every millisecond.
func fill(rate float64) (perFill uint32, interval time.Duration) {
	if rate >= 1000 {
		return uint32(min(math.Floor(rate/1000), math.MaxUint32)), time.Millisecond
	}
	ms := math.Ceil(1000 / rate)
	return 1, time.Duration(min(ms, float64(365*24*time.Hour/time.Millisecond))) * time.Millisecond
}

// tokenStrategy is a token bucket grant at rate (at least one token in an
// hour) with burst tokens, and the rate Envoy will actually fill at.
func tokenStrategy(rate float64, burst int64) (*typev3.RateLimitStrategy, float64) {
	perFill, interval := fill(rate)
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(min(burst, math.MaxUint32)),
		TokensPerFill: wrapperspb.UInt32(perFill),
		FillInterval:  durationpb.New(interval),
	}}}, float64(perFill) / interval.Seconds()
}

func blanket(allow bool) *typev3.RateLimitStrategy {
	rule := typev3.RateLimitStrategy_DENY_ALL
	if allow {
		rule = typev3.RateLimitStrategy_ALLOW_ALL
	}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}}
}

// filling is the rate g fills an Envoy's bucket at.
func (g *grant) filling() float64 {
	if g.kind != tokens {
		return 0
	}
	return g.rate
}

// owedTo is what the fill of g costs from its paidUntil to until, less its
// credit; below 0 when the credit covers it.
func (g *grant) owedTo(until int64) float64 {
	if g.kind != tokens || until <= g.paidUntil {
		return -g.credit
	}
	return g.rate*time.Duration(until-g.paidUntil).Seconds() - g.credit
}

// unspent is what g's fill was paid for beyond from, with its credit: what
// replacing g at from gives back. Its burst, handed out full, is never
// given back.
func (g *grant) unspent(from int64) float64 {
	if g.kind != tokens {
		return 0
	}
	return g.rate*max(0, time.Duration(g.paidUntil-from).Seconds()) + g.credit
}

// whole is a payment in the store's whole units, rounded up, and what it
// pays beyond amount.
func whole(amount float64) (units int64, extra float64) {
	if amount <= 0 {
		return 0, -amount
	}
	u := math.Ceil(amount - 1e-9)
	return int64(min(u, 1<<50)), max(0, u-amount)
}
