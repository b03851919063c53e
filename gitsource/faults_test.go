package gitsource_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
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
// cache fails the fetch at once with ErrCacheUnwritable naming the cache
// (never at the git deadline, never by a repair that would write more),
// an Update on a full disk and a fetch on a read-only one fail the same
// way, the cache stays readable, and the fetch after space is freed
// succeeds. The cache is on a 1 MB tmpfs in a mount namespace of the
// test's own (the test runs itself again under unshare), so no mount
// outlives it. Needs root and unshare(1).
func TestFullDiskUnderCache(t *testing.T) {
	if os.Getenv("GITSOURCE_OWN_MOUNTS") == "" {
		if os.Geteuid() != 0 {
			t.Skip("mounting a small tmpfs needs root")
		}
		unshare, err := exec.LookPath("unshare")
		if err != nil {
			t.Skip("unshare(1) is not installed (util-linux)")
		}
		cmd := exec.Command(unshare, "--mount", "--propagation", "private", os.Args[0], "-test.run=^TestFullDiskUnderCache$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "GITSOURCE_OWN_MOUNTS=1")
		out, err := cmd.CombinedOutput()
		if err != nil && strings.Contains(string(out), "unshare failed") {
			t.Skipf("no mount namespace here: %s", out)
		}
		t.Logf("in its own mount namespace:\n%s", out)
		require.NoError(t, err)
		require.Contains(t, string(out), "--- PASS: TestFullDiskUnderCache")
		return
	}
	ctx := context.Background()
	cache := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", cache).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", cache).Run() })
	logger, hook := logtest.NewNullLogger()
	rm := gittest.NewBare(t)
	c1 := gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"hosts/a.yaml": "a\n"}})
	dir := filepath.Join(cache, "git")
	r := open(t, gitsource.Options{URL: rm, CacheDir: dir, Timeout: time.Hour, Logger: logrus.NewEntry(logger)})
	tip, err := r.Fetch(ctx, "main")
	require.NoError(t, err)
	require.Equal(t, c1, tip)
	c2 := gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"blob.bin": noise(t, 4<<20)}})

	unwritable := func(what string, err error) {
		t.Helper()
		require.ErrorIs(t, err, gitsource.ErrCacheUnwritable, what)
		assert.Contains(t, err.Error(), dir, "%s: the error names the cache", what)
		for _, e := range hook.AllEntries() {
			assert.NotContains(t, e.Message, "repair", "%s: no repair on a full disk", what)
			assert.NotContains(t, e.Message, "afresh", "%s: no fresh clone on a full disk", what)
		}
		data, err := r.ReadFile(c1, "hosts/a.yaml")
		require.NoError(t, err, "%s: what the cache held is still there", what)
		assert.Equal(t, "a\n", string(data))
	}
	start := time.Now()
	_, err = r.Fetch(ctx, "main")
	t.Logf("full disk: fetch failed after %v (the git deadline is an hour): %v", time.Since(start).Round(time.Millisecond), err)
	unwritable("fetch", err)

	_, err = r.Update(ctx, "gitfleet/status", setFile("hosts/big.yaml", noise(t, 2<<20)))
	t.Logf("full disk: update: %v", err)
	unwritable("update", err)

	require.NoError(t, exec.Command("mount", "-o", "remount,size=64m", cache).Run())
	start = time.Now()
	tip, err = r.Fetch(ctx, "main")
	require.NoError(t, err)
	assert.Equal(t, c2, tip)
	t.Logf("full disk: recovered %v after space was freed", time.Since(start).Round(time.Millisecond))
	left, _ := filepath.Glob(filepath.Join(dir, "objects", "pack", "tmp_*"))
	assert.Empty(t, left, "no partial pack left behind")
	require.NoError(t, r.Close())

	// The same cache seen through a read-only mount.
	ro := t.TempDir()
	require.NoError(t, exec.Command("mount", "--bind", "-o", "ro", dir, ro).Run())
	t.Cleanup(func() { _ = exec.Command("umount", "-l", ro).Run() })
	_, err = gitsource.Open(ctx, gitsource.Options{URL: rm, CacheDir: ro, Logger: logrus.NewEntry(logger)})
	t.Logf("read-only cache: %v", err)
	require.ErrorIs(t, err, gitsource.ErrCacheUnwritable)
	assert.Contains(t, err.Error(), ro)
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
