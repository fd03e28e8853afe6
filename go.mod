module github.com/sluice-rl/sluice

go 1.26

require (
	github.com/sony/gobreaker/v2 v2.4.0
	go.yaml.in/yaml/v3 v3.0.6
)

require github.com/dunglas/httpsfv v1.1.2
