package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version is set at link time: go build -ldflags "-X main.version=v1.2.3".
var version = ""

func buildVersion() string {
	info, _ := debug.ReadBuildInfo()
	return describeBuild(version, info)
}

// describeBuild is the version line's first word: the link-time version if
// set, else the module's version, followed by the VCS revision, its time and
// "dirty" when built from a checkout with changes (go build stamps these
// unless -buildvcs=false).
func describeBuild(linked string, info *debug.BuildInfo) string {
	v := linked
	if v == "" && info != nil && info.Main.Version != "" {
		v = info.Main.Version
	}
	if v == "" {
		v = "(devel)"
	}
	if info == nil {
		return v
	}
	var rev, at string
	dirty := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return v
	}
	v += " (" + rev[:min(12, len(rev))]
	if at != "" {
		v += " " + at
	}
	if dirty {
		v += " dirty"
	}
	return v + ")"
}

func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		fmt.Fprintln(stderr, "Usage: sluice version\n\nExample:\n  sluice version")
		if args[0] == "-h" || args[0] == "--help" {
			return nil
		}
		return errUsage{fmt.Errorf("unexpected arguments")}
	}
	fmt.Fprintf(stdout, "sluice %s %s %s/%s\n", buildVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}
