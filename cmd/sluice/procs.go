package main

import (
	"os"
	"runtime"
	"strconv"
)

// procsPerCPU is how many Go processors (GOMAXPROCS) the gateway runs per
// CPU it may use.
//
// A proxy's work is system calls on sockets, and it shares its machine:
// with its upstream, a sidecar's neighbours, the clients of a load test.
// Go runs goroutines on a fixed number of processors (Ps), one per CPU by
// default. A thread holds its P through a system call, and when the kernel
// gives the CPU to another process the thread stops with the P held:
// sysmon hands such a P to another thread only after at least 20 µs, and
// not at all while another P is idle. With one P per CPU, requests ready
// to run then wait for a P while the CPU is free for them. Four per CPU
// keeps a runnable thread with a P for the kernel to schedule. On two
// cores shared with nginx as the upstream and wrk (docs/benchmarks.md,
// "Four Ps a CPU"): 20% more requests a second forwarded, p99 latency down
// by a third on forwarded requests and by two thirds on refused ones.
const procsPerCPU = 4

// setGatewayProcs gives the gateway procsPerCPU Ps per CPU unless
// GOMAXPROCS is set in its environment to a number the runtime takes (a
// positive one), which is then the operator's choice. The CPUs counted are
// the runtime's default: the machine's, or the container's CPU limit
// rounded up (at least 2). Setting it stops the runtime from following a
// CPU limit changed while the process runs.
func setGatewayProcs() {
	if n, err := strconv.Atoi(os.Getenv("GOMAXPROCS")); err == nil && n > 0 {
		return
	}
	runtime.GOMAXPROCS(procsPerCPU * runtime.GOMAXPROCS(0))
}
