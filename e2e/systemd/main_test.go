// Package systemd runs gitfleet's shipped systemd units (examples/systemd)
// under real systemd: a Debian 12 tree booted with systemd-nspawn
// (internal/nspawn), the freshly built binary installed in it. It is a
// package of its own, apart from e2e, so its cached tree's first build
// and its boots have their own test timeout.
//
// Every wait is a poll with a deadline that only bounds a broken run; no
// assertion is about speed. The tests skip, with the reason, when root,
// systemd-nspawn, nsenter, mmdebstrap or git is missing; QEMU is the
// tree's own.
package systemd

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/internal/tinyguest"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/e2etest"
)

// binary is the gitfleet binary TestMain builds; skipReason is set instead
// when the machine cannot run these tests.
var binary, skipReason string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	// git serves the fleet (git http-backend). QEMU is the container's
	// own, from the tree.
	if _, err := exec.LookPath("git"); err != nil {
		skipReason = "git is not installed (scripts/install-deps.sh installs it)"
		return m.Run()
	}
	b, remove, err := e2etest.BuildBinary("gitfleet-systemd-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer remove()
	binary = b
	return m.Run()
}

const host = "sd"

const hostFile = `apiVersion: gitfleet.dev/v1alpha1
kind: Host
metadata: {name: ` + host + `}
spec:
  capacity: {vcpus: 4, memoryMB: 1024}
`

// controllerInterval is the controller's poll interval (GITFLEET_INTERVAL).
const controllerInterval = "2s"

// waitLimit bounds every wait; it is far above what a working run needs
// under TCG on two busy cores and only ends a broken run.
const waitLimit = 4 * time.Minute

// fleet is the fleet's bare repository on the host and a working clone
// that pushes to it as a person would.
type fleet struct {
	t    *testing.T
	bare string
	work string
	url  string // the repository's URL inside the container
	// stall, while set, makes the git server hang every request until
	// its client leaves; stalled receives when one hangs.
	stall   atomic.Bool
	stalled chan struct{}
}

// push commits the given files in the working clone and pushes them.
func (f *fleet) push(msg string, write map[string]string) {
	f.t.Helper()
	e2etest.Push(f.t, f.work, msg, write)
}

// show reads branch:path in the bare repository; ok is false when absent.
func (f *fleet) show(branch, path string) ([]byte, bool) { return e2etest.Show(f.bare, branch, path) }

// status is the host's status file, nil before the agent wrote one.
func (f *fleet) status() *status.Status { return e2etest.Status(f.t, f.bare, host) }

// snapshot is the host's published snapshot, nil before there is one.
func (f *fleet) snapshot() *snapshots.Snapshot { return e2etest.Snapshot(f.t, f.bare, host) }

// waitFor polls cond until it holds; past waitLimit the test fails with
// cond's last account of what it saw.
func (f *fleet) waitFor(what string, cond func() (bool, string)) {
	f.t.Helper()
	start := time.Now()
	for {
		ok, seen := cond()
		if ok {
			f.t.Logf("%s (after %.1fs)", what, time.Since(start).Seconds())
			return
		}
		if time.Since(start) > waitLimit {
			f.t.Fatalf("waiting for %s: gave up after %s; last seen: %s", what, waitLimit, seen)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// vmState is how a condition reports a VM in its "last seen".
func vmState(st *status.Status, name string) string {
	if st == nil {
		return "no status yet"
	}
	if vm := st.VM(name); vm != nil {
		return fmt.Sprintf("%s phase=%s power=%s lastError=%q message=%q (heartbeat %d)", name, vm.Phase, vm.Power, vm.LastError, vm.Message, st.Heartbeat)
	}
	return fmt.Sprintf("%s not in vms (heartbeat %d)", name, st.Heartbeat)
}

// tinyGuest is the tiny guest's kernel and initramfs served over HTTP by
// an http.Handler the test mounts where the agent can reach it.
type tinyGuest struct {
	guest          *tinyguest.Guest
	kernel, initrd []byte
	handler        http.Handler
}

func newTinyGuest(t *testing.T) *tinyGuest {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	g, err := tinyguest.Build(ctx, tinyguest.TestCacheDir())
	require.NoError(t, err, "build the tiny guest")
	tg := &tinyGuest{guest: g}
	tg.kernel, err = os.ReadFile(g.Kernel)
	require.NoError(t, err)
	tg.initrd, err = os.ReadFile(g.Initrd)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.HandleFunc("/vmlinuz", func(w http.ResponseWriter, _ *http.Request) { w.Write(tg.kernel) })
	mux.HandleFunc("/initrd", func(w http.ResponseWriter, _ *http.Request) { w.Write(tg.initrd) })
	tg.handler = mux
	return tg
}

// vmFile is a running VM of the tiny guest whose artifacts are at baseURL.
func (tg *tinyGuest) vmFile(name, baseURL string) string {
	return fmt.Sprintf(`apiVersion: gitfleet.dev/v1alpha1
kind: VM
metadata:
  name: %s
spec:
  host: %s
  vcpus: 1
  memoryMB: 128
  diskGB: 1
  power: running
  kernel:
    url: %s/vmlinuz
    sha256: %x
    initrd: {url: %s/initrd, sha256: %x}
    cmdline: %q
  cloudInit:
    userData: |
      #cloud-config
      hostname: %s
`, name, host, baseURL, sha256.Sum256(tg.kernel), baseURL, sha256.Sum256(tg.initrd), tg.guest.Cmdline, name)
}

// memoryVMFile is a VM for the memory backend: nothing is fetched or
// booted, so the artifact is never downloaded.
func memoryVMFile(name string) string {
	return fmt.Sprintf(`apiVersion: gitfleet.dev/v1alpha1
kind: VM
metadata: {name: %s}
spec:
  host: %s
  vcpus: 1
  memoryMB: 128
  diskGB: 1
  power: running
  image:
    url: https://images.example.org/base.qcow2
    sha256: %s
`, name, host, strings.Repeat("ab", 32))
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
