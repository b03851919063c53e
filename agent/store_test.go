package agent_test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
)

// A VM's directory was given to QEMU's user by an earlier version, which a
// compromised QEMU could have used to put a FIFO or a symbolic link in
// place of the VM's record: reading the records neither blocks on the
// FIFO nor follows the link; each such record reads as unreadable (and
// its VM is reported, never acted on).
func TestRecordsThatAreNotRegularFilesAreUnreadable(t *testing.T) {
	dir := t.TempDir()
	st := mustStore(t, dir)
	require.NoError(t, st.SaveRecord(&agent.Record{Name: "real", InstanceID: "real-1"}))
	secret := filepath.Join(t.TempDir(), "secret.json")
	require.NoError(t, os.WriteFile(secret, []byte(`{"name": "linked", "instanceID": "from a host file"}`), 0o600))
	for name, plant := range map[string]func(path string) error{
		"linked": func(path string) error { return os.Symlink(secret, path) },
		"fifo":   func(path string) error { return syscall.Mkfifo(path, 0o600) },
	} {
		require.NoError(t, os.MkdirAll(st.VMDir(name), 0o700))
		require.NoError(t, plant(st.RecordPath(name)))
	}
	fifo := st.RecordPath("fifo")
	t.Cleanup(func() {
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})

	done := make(chan struct{})
	var recs map[string]*agent.Record
	var bad map[string]error
	var err error
	go func() { defer close(done); recs, bad, err = st.LoadRecords() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("LoadRecords blocked on a FIFO in place of a record")
	}
	require.NoError(t, err)
	assert.Contains(t, recs, "real")
	assert.NotContains(t, recs, "linked", "a record read through a symbolic link")
	for _, name := range []string{"linked", "fifo"} {
		assert.True(t, errors.Is(bad[name], agent.ErrRecordUnreadable), "%s: %v", name, bad[name])
	}
	t.Logf("linked: %v; fifo: %v", bad["linked"], bad["fifo"])
}
