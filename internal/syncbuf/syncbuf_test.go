package syncbuf

import (
	"strings"
	"sync"
	"testing"
)

// Writes and reads run at once (go test -race checks the lock); every
// write is kept, in order per writer.
func TestBufferConcurrentWriteAndRead(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 1000; i++ {
			_, _ = b.Write([]byte("x"))
		}
	}()
	for i := 0; i < 100; i++ {
		_ = b.String()
	}
	wg.Wait()
	if got := b.String(); got != strings.Repeat("x", 1000) {
		t.Fatalf("got %d bytes, want 1000", len(got))
	}
}
