package server

import (
	"os"
	"os/exec"
	"runtime/pprof"
	"testing"
)

func TestProfReject(t *testing.T) {
	if os.Getenv("PROF") == "" {
		t.Skip()
	}
	base := startFast(t, "http://127.0.0.1:9", "rules:\n  - {id: strict, key: [ip], rate: 1, per: 1h}\n", FastOptions{})
	f, _ := os.Create("/tmp/rej.prof")
	pprof.StartCPUProfile(f)
	out, err := exec.Command("wrk", "-t2", "-c64", "-d5s", "--latency", base+"/strict").CombinedOutput()
	pprof.StopCPUProfile()
	f.Close()
	t.Log(string(out), err)
}
