module github.com/sluice-rl/sluice

go 1.26

require (
	github.com/sony/gobreaker/v2 v2.4.0
	go.yaml.in/yaml/v3 v3.0.6
)

require (
	github.com/dunglas/httpsfv v1.1.2
	github.com/schollz/progressbar/v3 v3.19.1
	golang.org/x/term v0.44.0
)

require (
	github.com/mitchellh/colorstring v0.0.0-20190213212951-d06e56a500db // indirect
	github.com/rivo/uniseg v0.4.7 // indirect
	golang.org/x/sys v0.46.0 // indirect
)
