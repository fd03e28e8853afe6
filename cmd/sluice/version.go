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
	if version != "" {
		return version
	}
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
		return info.Main.Version
	}
	return "(devel)"
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
