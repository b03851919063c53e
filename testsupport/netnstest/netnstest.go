// Package netnstest runs a test inside a network namespace of its own, so
// that it can make bridges, taps, dnsmasq and nftables rules, and boot
// guests on them, without touching the host's network or another test's.
//
// Usage, at the top of a test function:
//
//	func TestNAT(t *testing.T) {
//		if !netnstest.Enter(t) {
//			return // the test ran in its namespace (or was skipped)
//		}
//		... // runs inside the namespace
//	}
//
// Enter, in the test process, creates a namespace with a unique name
// ("gft-<pid>-<random>"), runs the test binary again under
// `ip netns exec` for this one test, reports its output and result,
// then ends every process still in the namespace (the dnsmasq and QEMU
// the test started there) and deletes it. In the child process it returns
// true. Nothing in the namespace can reach the host's network: it starts
// with only its loopback device, up.
package netnstest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// EnvName is set, in the child process, to the namespace's name.
const EnvName = "GITFLEET_TEST_NETNS"

// Name is the namespace the current process runs in, as Enter made it;
// "" outside one.
func Name() string { return os.Getenv(EnvName) }

// Enter runs t in a new network namespace; see the package comment. It
// skips t when not root or when ip(8) is missing. t must be a top-level
// test.
func Enter(t *testing.T) bool {
	t.Helper()
	if Name() != "" {
		return true
	}
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip (iproute2) is not installed")
	}
	var b [3]byte
	rand.Read(b[:])
	ns := "gft-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
	}
	defer remove(t, ns)
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip -n %s link set lo up: %v: %s", ns, err, out)
	}
	args := []string{"netns", "exec", ns, os.Args[0], "-test.run", "^" + t.Name() + "$", "-test.count=1", "-test.v"}
	if d, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout="+time.Until(d).Round(time.Second).String())
	}
	cmd := exec.Command("ip", args...)
	cmd.Env = append(os.Environ(), EnvName+"="+ns)
	out, err := cmd.CombinedOutput()
	t.Logf("in network namespace %s:\n%s", ns, out)
	switch {
	case err != nil:
		t.Fatalf("test in network namespace %s failed: %v", ns, err)
	case strings.Contains(string(out), "--- SKIP: "+t.Name()):
		t.Skip("skipped in its network namespace (see the log)")
	case !strings.Contains(string(out), "--- PASS: "+t.Name()):
		t.Fatalf("test in network namespace %s did not report a pass", ns)
	}
	return false
}

// remove ends the processes left in namespace ns and deletes it.
func remove(t *testing.T, ns string) {
	out, _ := exec.Command("ip", "netns", "pids", ns).Output()
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
		t.Errorf("ip netns del %s: %v: %s", ns, err, out)
	}
}

// Listen listens on addr (TCP) inside the named network namespace
// (/run/netns/<ns>, as `ip netns add` makes it), standing in for a service
// of the machine that namespace plays. The listener is the caller's to
// close; the calling goroutine's thread is switched into the namespace
// only while it opens it.
func Listen(ns, addr string) (net.Listener, error) {
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		return nil, fmt.Errorf("namespace %s: %w", ns, err)
	}
	defer target.Close()
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// The switch is per thread: this goroutine keeps its thread, and
		// a thread that cannot switch back ends with it (no Unlock).
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer self.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("setns: %w", err)}
			return
		}
		l, err := net.Listen("tcp", addr)
		if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{l, err}
	}()
	r := <-ch
	if r.err != nil {
		return nil, fmt.Errorf("listen on %s in namespace %s: %w", addr, ns, r.err)
	}
	return r.l, nil
}
