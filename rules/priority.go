package rules

import (
	"strings"

	"github.com/sluice-rl/sluice"
)

// Priority says which tier a request belongs to, for rules whose limit is
// shared by tiers (Rule.Tiers). A request's tier comes from the first of
// Routes whose pattern matches its path, else from the value of Source
// (such as a header X-Priority set by a trusted proxy), else it is Default.
//
// A client that can set the source can claim any tier: take it from a
// header that your edge proxy sets (and strips from clients), or from the
// route.
type Priority struct {
	// Levels are the tiers, highest first (default: critical, default,
	// sheddable).
	Levels []string
	// Source, if set, gives a tier's name.
	Source *Source
	// Routes map path patterns to a tier, in file order.
	Routes []PriorityRoute
	// Default is the level index of a request no route or value places.
	Default int
}

// PriorityRoute places the requests whose path matches Pattern in Level.
type PriorityRoute struct {
	Pattern *Pattern
	Level   int
}

// MaxLevels bounds the tiers a priority section may name.
const MaxLevels = 8

// DefaultLevels are the tiers when the file names none.
var DefaultLevels = []string{"critical", "default", "sheddable"}

// Level returns req's tier as an index into Levels (0 is the highest).
func (p *Priority) Level(req *Request) int {
	if p == nil {
		return 0
	}
	for _, r := range p.Routes {
		if r.Pattern.Match(req.Path) {
			return r.Level
		}
	}
	if p.Source != nil {
		if v, ok := p.Source.Value(req, ""); ok {
			for i, l := range p.Levels {
				if strings.EqualFold(v, l) {
					return i
				}
			}
		}
	}
	return p.Default
}

// Floor returns the units a request of tier level must leave in a limit
// of capacity units: the shares kept for the tiers above it.
func (t Tiers) Floor(level int, capacity int64) int64 {
	share := 0.0
	for i := 0; i < level && i < len(t); i++ {
		share += t[i]
	}
	return int64(share * float64(capacity))
}

// Tiers are the shares of a limit kept for each tier (by level index, the
// highest first): a tier may not take the shares of the tiers above it.
type Tiers []float64

// AdaptiveScale is how finely an adaptive rule's rate can shrink: its
// limit is counted in 1/AdaptiveScale units, so a request of cost c under
// factor f takes ceil(c * AdaptiveScale / f) of them.
const AdaptiveScale = 64

// AdaptiveLimit is the limit an adaptive rule counts in the store: l in
// 1/AdaptiveScale units, the same rate and burst.
func AdaptiveLimit(l sluice.Limit) sluice.Limit {
	s := l
	s.Rate = l.Rate * AdaptiveScale
	s.Burst = l.Capacity() * AdaptiveScale
	return s
}
