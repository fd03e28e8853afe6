//go:build unix

package gateway

import "syscall"

// fileLimit is the process's limit of open files (RLIMIT_NOFILE), or 0 if
// it cannot be read.
func fileLimit() int {
	var r syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r) != nil || r.Cur > 1<<30 {
		return 0
	}
	return int(r.Cur)
}
