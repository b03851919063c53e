package nspawn

import (
	"context"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBootExecListenClose boots the tree, runs commands inside, reaches
// a listener of the test's from inside the container and not from the
// host, and leaves no process or cgroup behind.
func TestBootExecListenClose(t *testing.T) {
	if why := Missing(); why != "" {
		t.Skipf("booting systemd in a container needs %s", why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	rootfs, err := BuildRootfs(ctx, TestCacheDir())
	require.NoError(t, err)

	m, err := Boot(ctx, Config{Rootfs: rootfs})
	require.NoError(t, err)
	closed := false
	defer func() {
		if !closed {
			m.Close()
		}
	}()

	// systemd is PID 1 and the container has its own network: only lo.
	out, err := m.Exec(ctx, "cat", "/proc/1/comm")
	require.NoError(t, err)
	assert.Equal(t, "systemd", strings.TrimSpace(string(out)))
	out, err = m.Exec(ctx, "ls", "/sys/class/net")
	require.NoError(t, err)
	assert.Equal(t, []string{"lo"}, strings.Fields(string(out)))
	// The overlay is writable and the cached tree is not written.
	_, err = m.Exec(ctx, "sh", "-c", "echo x >/etc/written-by-test")
	require.NoError(t, err)
	_, err = os.Stat(rootfs + "/etc/written-by-test")
	assert.True(t, os.IsNotExist(err), "a write inside reached the cached tree: %v", err)

	l, err := m.Listen("127.0.0.1:0")
	require.NoError(t, err)
	hits := make(chan string, 4)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits <- r.URL.Path
		http.NotFound(w, r)
	})}
	go srv.Serve(l)
	defer srv.Close()
	// git is in the tree; its http client is the container's.
	_, _ = m.Exec(ctx, "git", "ls-remote", "http://"+l.Addr().String()+"/probe.git")
	select {
	case p := <-hits:
		assert.Equal(t, "/probe.git/info/refs", p)
	case <-time.After(30 * time.Second):
		t.Fatal("the listener was not reached from inside the container")
	}
	// From the host, the same address is not the listener.
	resp, err := http.Get("http://" + l.Addr().String() + "/host.git")
	if err == nil {
		resp.Body.Close()
	}
	select {
	case p := <-hits:
		t.Errorf("the host reached the container's listener (%s)", p)
	default:
	}

	leader, cgroups := m.Leader, m.cgroups
	closed = true
	require.NoError(t, m.Close())
	_, err = os.Stat("/proc/" + strconv.Itoa(leader))
	assert.True(t, os.IsNotExist(err), "the container's PID 1 outlived Close")
	for _, dir := range cgroups {
		_, err := os.Stat(dir)
		assert.True(t, os.IsNotExist(err), "cgroup %s outlived Close", dir)
	}
}
