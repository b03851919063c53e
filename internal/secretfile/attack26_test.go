package secretfile

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A FIFO, or any special file, at a secret's path is refused at once: an
// open that waited for a writer would hang the agent or controller at
// start (every credential, key and password file is read through Read).
func TestAttackFIFOAtASecretsPathIsRefusedAtOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := Read(path, "token file", "others can read it", 64)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("Read of a FIFO = %v; want it refused as not a regular file", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Read of a FIFO still waits for a writer after 10 s")
	}
}
