package h2grpc

import (
	"os"
	"time"
)

// patience is how long a test waits for what must happen: long enough
// for a loaded machine, and short under a mutation run
// (SLUICE_MUTATION=1), where a mutant that breaks what a test waits for
// would otherwise hold every run for the whole wait.
var patience = func() time.Duration {
	if os.Getenv("SLUICE_MUTATION") != "" {
		return 4 * time.Second // the connection watcher ticks each second: some waits are two ticks
	}
	return 10 * time.Second
}()
