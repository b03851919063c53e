package qemu

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/agent"
)

// The freeze is tested against the real qemu-guest-agent on this host.
// qemu-ga's guest-fsfreeze-freeze freezes every block-device filesystem
// in its mount table, and this host's own root is one: so qemu-ga runs
// jailed, chrooted into a directory of its own (holding a copy of
// itself and its libraries) inside a private mount namespace where the
// only block-device filesystem is a small ext4 image on a loop device at
// /data. A mount table naming any other block device fails the test
// before anything is frozen.

// jailedQGA is a qemu-ga whose only freezable filesystem is its /data.
type jailedQGA struct {
	dir  string // the jail's root on this host; qga.sock is in it
	pid  int
	sock string
}

func startJailedQGA(t testing.TB) *jailedQGA {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the jailed guest agent needs root (mount namespace, loop device)")
	}
	bin, err := exec.LookPath("qemu-ga")
	if err != nil {
		if bin, err = exec.LookPath("/usr/sbin/qemu-ga"); err != nil {
			t.Skip("qemu-ga not installed (qemu-guest-agent; scripts/install-deps.sh installs it)")
		}
	}
	for _, tool := range []string{"unshare", "mkfs.ext4", "ldd", "chroot"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	tmp := t.TempDir()
	img := filepath.Join(tmp, "data.ext4")
	if out, err := exec.Command("mkfs.ext4", "-q", img, "32M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	root := filepath.Join(tmp, "jail")
	if err := os.MkdirAll(filepath.Join(root, "state"), 0o700); err != nil {
		t.Fatal(err)
	}
	copyWithLibraries(t, bin, root)
	for _, d := range []string{"data", "proc", "dev"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	script := `set -e
mount -o loop "$2" "$1/data"
mount -t proc proc "$1/proc"
exec chroot "$1" "$3" -m unix-listen -p /qga.sock -t /state`
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", root, img, bin)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	j := &jailedQGA{dir: root, pid: cmd.Process.Pid, sock: filepath.Join(root, QGASocket)}
	t.Cleanup(func() {
		// Thaw before stopping it, whatever the test did.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		qgaCall(ctx, j.sock, "guest-fsfreeze-thaw", nil, nil)
		cancel()
		cmd.Process.Kill()
		cmd.Wait()
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(j.sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the jailed qemu-ga never made its socket")
		}
		time.Sleep(50 * time.Millisecond)
	}
	j.checkMounts(t)
	return j
}

// checkMounts fails the test unless the only block-device filesystem
// qemu-ga sees is the loop device at /data.
func (j *jailedQGA) checkMounts(t testing.TB) {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/mounts", j.pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var seen []string
	sc := bufio.NewScanner(f)
	loop := false
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || !strings.HasPrefix(fields[0], "/") {
			continue
		}
		seen = append(seen, sc.Text())
		if !strings.HasPrefix(fields[0], "/dev/loop") || fields[1] != "/data" {
			t.Fatalf("the jailed qemu-ga would freeze %s at %s: refusing to run (mounts: %v)", fields[0], fields[1], seen)
		}
		loop = true
	}
	if !loop {
		t.Fatalf("the jailed qemu-ga sees no /data: %v", seen)
	}
}

// status is guest-fsfreeze-status: "frozen" or "thawed".
func (j *jailedQGA) status(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var s string
	if err := qgaCall(ctx, j.sock, "guest-fsfreeze-status", nil, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// copyWithLibraries copies bin and every library ldd names into root at
// the same paths.
func copyWithLibraries(t testing.TB, bin, root string) {
	t.Helper()
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		t.Fatalf("ldd %s: %v", bin, err)
	}
	files := []string{bin}
	for _, f := range strings.Fields(string(out)) {
		if strings.HasPrefix(f, "/") {
			files = append(files, f)
		}
	}
	for _, f := range files {
		dst := filepath.Join(root, f)
		os.MkdirAll(filepath.Dir(dst), 0o755)
		if out, err := exec.Command("cp", "-L", f, dst).CombinedOutput(); err != nil {
			t.Fatalf("cp %s: %v: %s", f, err, out)
		}
	}
}

// jailState is a vmState whose guest agent is the jailed qemu-ga.
func (j *jailedQGA) state() *vmState { return &vmState{name: "frozen-guest", dir: j.dir} }

func TestFreezeThawsOnEveryPathAgainstRealGuestAgent(t *testing.T) {
	j := startJailedQGA(t)
	p, err := New(Config{CacheDir: t.TempDir(), Accel: AccelTCG, Logger: quietLog().Logger})
	if err != nil {
		t.Fatal(err)
	}
	log := quietLog()

	t.Run("freeze then thaw", func(t *testing.T) {
		fz := p.freezeGuest(context.Background(), j.state(), agent.SnapshotOptions{}, log)
		if fz.err != nil || fz.filesystems != 1 {
			t.Fatalf("freeze: %v, %d filesystems; want /data frozen", fz.err, fz.filesystems)
		}
		if s := j.status(t); s != "frozen" {
			t.Fatalf("status %q while frozen", s)
		}
		frozen, err := fz.thaw()
		if err != nil || frozen <= 0 {
			t.Fatalf("thaw: %v after %s", err, frozen)
		}
		if s := j.status(t); s != "thawed" {
			t.Fatalf("status %q after thaw", s)
		}
	})
	t.Run("the hard bound thaws a freeze nobody ends", func(t *testing.T) {
		fz := p.freezeGuest(context.Background(), j.state(), agent.SnapshotOptions{FrozenMax: 300 * time.Millisecond}, log)
		if fz.err != nil {
			t.Fatal(fz.err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for !fz.expired() {
			if time.Now().After(deadline) {
				t.Fatal("the FrozenMax timer never thawed the guest")
			}
			time.Sleep(20 * time.Millisecond)
		}
		fz.thaw()
		if s := j.status(t); s != "thawed" {
			t.Fatalf("status %q after the bound", s)
		}
	})
	t.Run("a cancelled context still thaws", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		fz := p.freezeGuest(ctx, j.state(), agent.SnapshotOptions{}, log)
		cancel()
		fz.thaw()
		if s := j.status(t); s != "thawed" {
			t.Fatalf("status %q after a cancelled snapshot", s)
		}
	})
}

// An agent killed while the guest is frozen leaves the marker; the next
// agent's first look at the VM thaws it.
func TestSweepThawsWhatAKilledAgentLeftFrozen(t *testing.T) {
	j := startJailedQGA(t)
	const name = "frozen-guest"
	// A stand-in for the VM's QEMU, whose command line names the VM and
	// its pidfile as Boot's does.
	pidfile := filepath.Join(j.dir, PidFile)
	stand := exec.Command("sh", "-c", "sleep 600", "qemu", "-name", "guest="+name, "-pidfile", pidfile)
	if err := stand.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stand.Process.Kill(); stand.Wait() })
	os.WriteFile(pidfile, []byte(strconv.Itoa(stand.Process.Pid)), 0o600)
	if err := writeVMFile(j.dir, SnapshotMarker, markerJSON(snapshotMarker{Freeze: true}), nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	if err := qgaCall(ctx, j.sock, "guest-fsfreeze-freeze", nil, &n); err != nil || n != 1 {
		t.Fatalf("freeze: %v (%d)", err, n)
	}
	p, err := New(Config{CacheDir: t.TempDir(), Accel: AccelTCG, Logger: quietLog().Logger, MachineDir: func(string) string { return j.dir }})
	if err != nil {
		t.Fatal(err)
	}
	p.Running(name) // the restarted agent's first look at the VM
	deadline := time.Now().Add(30 * time.Second)
	for j.status(t) != "thawed" {
		if time.Now().After(deadline) {
			t.Fatal("the restarted agent never thawed the guest")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// BenchmarkFreezeThaw measures how long a guest stays frozen (freeze to
// thaw answered) against the real guest agent: p50 and p99 in ms.
func BenchmarkFreezeThaw(b *testing.B) {
	j := startJailedQGA(b)
	p, err := New(Config{CacheDir: b.TempDir(), Accel: AccelTCG, Logger: quietLog().Logger})
	if err != nil {
		b.Fatal(err)
	}
	var d []time.Duration
	for i := 0; i < b.N; i++ {
		fz := p.freezeGuest(context.Background(), j.state(), agent.SnapshotOptions{}, quietLog())
		if fz.err != nil {
			b.Fatal(fz.err)
		}
		frozen, err := fz.thaw()
		if err != nil {
			b.Fatal(err)
		}
		d = append(d, frozen)
	}
	sort.Slice(d, func(i, k int) bool { return d[i] < d[k] })
	b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(d[(len(d)*99)/100].Microseconds())/1000, "p99-ms")
}
