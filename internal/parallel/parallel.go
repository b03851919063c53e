// Package parallel runs independent steps of one loop on every core.
package parallel

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// For calls f(i) for every i in [0, n), on min(GOMAXPROCS, n) goroutines
// that take the next index as they finish one, and returns when every
// call has. f must be safe to call concurrently; each index is called
// exactly once, in no particular order.
func For(n int, f func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				f(i)
			}
		}()
	}
	wg.Wait()
}
