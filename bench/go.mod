module github.com/sluice-rl/sluice/bench

go 1.26.0

require (
	github.com/sethvargo/go-limiter v0.7.1
	github.com/sluice-rl/sluice v0.0.0
	github.com/throttled/throttled/v2 v2.15.0
	github.com/ulule/limiter/v3 v3.11.2
	golang.org/x/time v0.16.0
)

require (
	github.com/hashicorp/golang-lru v0.5.4 // indirect
	github.com/pkg/errors v0.9.1 // indirect
)

replace github.com/sluice-rl/sluice => ../
