package gitsource_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/gitsource/gittest"
)

// faultTimeout is the git deadline of the fault tests: short, so a stall
// is detected quickly, long enough for a loaded machine to fetch.
const faultTimeout = 5 * time.Second

// noise is n bytes that do not compress, so a pack holding them is about n
// bytes long.
func noise(t testing.TB, n int) string {
	b := make([]byte, n/2)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// TestTransportFaults: a server that accepts and stalls, one that stalls
// after N bytes, one that resets mid-pack, over http and over the file
// transport through a wrapper git-upload-pack. Each fetch under a fault
// fails within the deadline (plus the kill's grace), leaves what the cache
// held readable, and the next fetch after the fault is removed succeeds.
// With -v it prints, per fault, the time to detection and to recovery.
func TestTransportFaults(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	bare := filepath.Join(root, "fleet.git")
	gittest.Git(t, "", "init", "--quiet", "--bare", "--initial-branch=main", bare)
	srv := gittest.ServeFaulty(t, root)
	urls := map[string]string{"http": srv.HTTPURL + "/fleet.git", "file": "file://" + bare}
	for _, transport := range []string{"http", "file"} {
		for _, fault := range []gittest.Fault{gittest.Stall, gittest.StallAfter, gittest.Reset} {
			t.Run(transport+"/"+fault.String(), func(t *testing.T) {
				c1 := gittest.Commit(t, bare, gittest.Edit{Write: map[string]string{"hosts/a.yaml": noise(t, 64)}})
				r := open(t, gitsource.Options{URL: urls[transport], CacheDir: t.TempDir(), Timeout: faultTimeout})
				tip, err := r.Fetch(ctx, "main")
				require.NoError(t, err)
				require.Equal(t, c1, tip)
				// The next commit's pack is about 256 KiB: the fault cuts
				// it at 32 KiB, past the ref advertisement.
				c2 := gittest.Commit(t, bare, gittest.Edit{Write: map[string]string{"blob.bin": noise(t, 256<<10)}})

				srv.Set(fault, 32<<10)
				start := time.Now()
				_, err = r.Fetch(ctx, "main")
				detect := time.Since(start)
				require.Error(t, err)
				t.Logf("fault %s over %s: detected after %v: %v", fault, transport, detect.Round(time.Millisecond), err)
				if fault != gittest.Reset {
					assert.ErrorIs(t, err, gitsource.ErrTimeout)
				}
				data, err := r.ReadFile(c1, "hosts/a.yaml")
				require.NoError(t, err, "what the cache held is still there")
				assert.Len(t, data, 64)

				srv.Set(gittest.NoFault, 0)
				start = time.Now()
				tip, err = r.Fetch(ctx, "main")
				recover := time.Since(start)
				require.NoError(t, err)
				assert.Equal(t, c2, tip)
				t.Logf("fault %s over %s: recovered %v after the fault was removed", fault, transport, recover.Round(time.Millisecond))
			})
		}
	}
}

// TestFullDiskUnderCache: a commit larger than the space left under the
// cache fails the fetch at once (never hangs), leaves the cache readable,
// and the fetch after space is freed succeeds. Needs root (a tmpfs is
// mounted under the test's directory).
func TestFullDiskUnderCache(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	ctx := context.Background()
	cache := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", cache).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", cache).Run() })
	rm := gittest.NewBare(t)
	c1 := gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"hosts/a.yaml": "a\n"}})
	r := open(t, gitsource.Options{URL: rm, CacheDir: filepath.Join(cache, "git"), Timeout: faultTimeout})
	tip, err := r.Fetch(ctx, "main")
	require.NoError(t, err)
	require.Equal(t, c1, tip)
	c2 := gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"blob.bin": noise(t, 4<<20)}})

	start := time.Now()
	_, err = r.Fetch(ctx, "main")
	t.Logf("full disk: detected after %v: %v", time.Since(start).Round(time.Millisecond), err)
	require.Error(t, err)
	data, err := r.ReadFile(c1, "hosts/a.yaml")
	require.NoError(t, err)
	assert.Equal(t, "a\n", string(data))

	require.NoError(t, exec.Command("mount", "-o", "remount,size=64m", cache).Run())
	start = time.Now()
	tip, err = r.Fetch(ctx, "main")
	require.NoError(t, err)
	assert.Equal(t, c2, tip)
	t.Logf("full disk: recovered %v after space was freed", time.Since(start).Round(time.Millisecond))
}

// TestSSHServerThatNeverAnswers: an ssh server that accepts the connection
// and never sends its version (go-git runs the ssh handshake without a
// context) fails the fetch at the deadline instead of hanging.
func TestSSHServerThatNeverAnswers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // held open, never answered
		}
	}()
	keys := gittest.ServeSSH(t, t.TempDir()) // a client key and known_hosts
	r := open(t, gitsource.Options{URL: "ssh://git@" + ln.Addr().String() + "/fleet.git", Timeout: faultTimeout,
		Auth: gitsource.Auth{SSHKeyFile: keys.KeyFile, KnownHostsFile: keys.KnownHostsFile}})
	start := time.Now()
	_, err = r.Fetch(context.Background(), "main")
	t.Logf("stalled ssh server: detected after %v: %v", time.Since(start).Round(time.Millisecond), err)
	assert.ErrorIs(t, err, gitsource.ErrTimeout)
	_, err = r.RemoteHead(context.Background(), "main")
	assert.ErrorIs(t, err, gitsource.ErrTimeout)
}
