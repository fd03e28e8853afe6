package global

import (
	"fmt"
	"sync"
	"testing"
)

// Demand counts every decision of the keys it keeps, refusals apart, from
// many goroutines; a take starts afresh; keys past the bound go uncounted
// and are said to be dropped, never kept.
func TestDemandCountsWithinItsBound(t *testing.T) {
	d := NewDemand(demandShards * 4) // four keys a shard
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				d.Add("r", "hot", 2, (i+g)%4 != 0)
			}
		}()
	}
	wg.Wait()
	got := d.Take()["r"]
	if len(got) != 1 || got[0] != (Count{Key: "hot", Asked: 16000, Short: 4000}) {
		t.Fatalf("counted %+v, want hot asked 16000, short 4000", got)
	}
	if left := d.Take(); len(left) != 0 {
		t.Fatalf("a second take found %+v", left)
	}
	for i := range 10_000 {
		d.Add("r", fmt.Sprint("k", i), 1, true)
	}
	kept := len(d.Take()["r"])
	if kept > demandShards*4 || kept == 0 {
		t.Fatalf("kept %d keys, bound %d", kept, demandShards*4)
	}
	if d.Dropped() != uint64(10_000-kept) {
		t.Fatalf("dropped %d, want %d", d.Dropped(), 10_000-kept)
	}
}
