package server

import (
	"os/exec"
	"syscall"
)

// setProcessGroup puts cmd in a process group of its own that dies with the
// test process (parent-death signal), so no child outlives a panicking or
// timed-out test.
func setProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

func killGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}
