package gitsource

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestDeliverKeepsLatest: a reader that fell behind finds the latest tip,
// and the watcher never blocks on it.
func TestDeliverKeepsLatest(t *testing.T) {
	out := make(chan string, 1)
	deliver(out, "a")
	deliver(out, "b")
	deliver(out, "c")
	assert.Equal(t, "c", <-out)
	select {
	case v := <-out:
		t.Fatalf("stale value %q left behind", v)
	default:
	}
}
