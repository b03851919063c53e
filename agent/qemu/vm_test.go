package qemu

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/internal/tinyguest"
)

// These tests boot real VMs under TCG: the tiny guest (Debian kernel and a
// busybox initramfs, see internal/tinyguest) served from a local HTTP
// server, so they need no network beyond loopback.

func needQEMU(t testing.TB) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not installed (apt-get install qemu-system-x86 qemu-utils busybox-static)")
	}
	needQEMUImg(t)
}

var (
	guestOnce sync.Once
	guest     *tinyguest.Guest
	guestErr  error
)

// tinyGuest builds the tiny guest once per test binary, in a cache dir
// kept across runs ($GITFLEET_TEST_CACHE or the user cache dir).
func tinyGuest(t testing.TB) *tinyguest.Guest {
	guestOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		guest, guestErr = tinyguest.Build(ctx, tinyguest.TestCacheDir())
	})
	if guestErr != nil {
		t.Fatalf("build tiny guest: %v", guestErr)
	}
	return guest
}

// guestSpec serves the tiny guest's kernel and initrd from srv and returns
// a kernel-boot spec for it.
func guestSpec(t testing.TB, srv *artifactServer) desired.VMSpec {
	g := tinyGuest(t)
	k, err := os.ReadFile(g.Kernel)
	if err != nil {
		t.Fatal(err)
	}
	i, err := os.ReadFile(g.Initrd)
	if err != nil {
		t.Fatal(err)
	}
	ka := srv.add("/tiny/vmlinuz", k)
	ia := srv.add("/tiny/initrd", i)
	return desired.VMSpec{
		VCPUs: 1, MemoryMB: 128, DiskGB: 1,
		Kernel: &desired.Kernel{URL: ka.URL, SHA256: ka.SHA256, Initrd: &ia, Cmdline: g.Cmdline},
		// No sshAuthorizedKeys: the tiny guest runs no sshd, and a guest
		// given keys is ready only once its sshd answers.
		CloudInit: &desired.CloudInit{UserData: "#cloud-config\n"},
	}
}

// newTestProvisioner makes a TCG provisioner whose MachineDir maps names
// under vmRoot, as the agent's state store would.
func newTestProvisioner(t testing.TB, cache, vmRoot string, srv *artifactServer) *Provisioner {
	p, err := New(Config{
		CacheDir: cache, Accel: AccelTCG, Artifacts: loopbackPolicy(),
		MachineDir:       func(name string) string { return filepath.Join(vmRoot, name) },
		PowerdownTimeout: 30 * time.Second, KillTimeout: 5 * time.Second,
		BootTimeout: 60 * time.Second,
		Logger:      quietLog().Logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// serial reads the guest's serial log.
func serial(dir string) string {
	b, _ := os.ReadFile(filepath.Join(dir, SerialLog))
	return string(b)
}

// waitSerial waits for a line containing want on the serial console. The
// deadline only bounds a broken guest; nothing here asserts on time.
func waitSerial(t *testing.T, dir, want string) string {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		if s := serial(dir); strings.Contains(s, want) {
			return s
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no %q on the serial console; it has:\n%s", want, serial(dir))
	return ""
}

// guestLines returns the tiny guest's own lines ("tinyguest: ...").
func guestLines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); strings.HasPrefix(l, tinyguest.LinePrefix) {
			out = append(out, strings.TrimPrefix(l, tinyguest.LinePrefix))
		}
	}
	return out
}

// waitReady polls Readiness until the guest has answered (at most 5 min).
func waitReady(t *testing.T, p *Provisioner, name string) agent.Readiness {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		r := p.Readiness(name)
		if r.Ready {
			requireConfined(t, p, name)
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("guest never answered: %+v", r)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// requireConfined checks in /proc that the QEMU of VM name runs under its
// seccomp sandbox and, when the test runs as root, as DefaultQEMUUser: a
// provisioner left at its defaults never runs a guest as root.
func requireConfined(t *testing.T, p *Provisioner, name string) {
	t.Helper()
	st := p.state(name, "")
	if st == nil || st.pid() == 0 {
		t.Fatalf("VM %s is ready but has no QEMU process", name)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", st.pid()))
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(l, ":")
		fields[k] = strings.Join(strings.Fields(v), " ")
	}
	if fields["Seccomp"] != "2" {
		t.Errorf("VM %s: QEMU runs without its seccomp sandbox (Seccomp: %s)", name, fields["Seccomp"])
	}
	if os.Geteuid() != 0 {
		return
	}
	u, err := user.Lookup(DefaultQEMUUser)
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Repeat(u.Uid+" ", 3) + u.Uid; fields["Uid"] != want {
		t.Errorf("VM %s: QEMU runs as uids %q, want %s's %q", name, fields["Uid"], DefaultQEMUUser, want)
	}
}

func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

func TestVMLifecycle(t *testing.T) {
	needQEMU(t)
	t.Parallel()
	srv := newArtifactServer(t)
	spec := guestSpec(t, srv)
	cache := t.TempDir()
	// A state directory deep enough that <dir>/qmp.sock overflows the
	// 108-byte sun_path: QMP must still work.
	vmRoot := filepath.Join(t.TempDir(), strings.Repeat("deep-state-directory-", 4))
	name := "web-01"
	dir := filepath.Join(vmRoot, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if n := len(filepath.Join(dir, QMPSocket)); n <= maxSunPath {
		t.Fatalf("test directory too short (%d) to exercise the sun_path limit", n)
	}
	// The volume lives inside the VM's directory on purpose: Destroy must
	// still leave it alone.
	vol := filepath.Join(dir, "web-01-data.img")
	const volBytes = 64 << 20
	if err := os.WriteFile(vol, []byte("guest data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(vol, volBytes); err != nil {
		t.Fatal(err)
	}
	// A small qcow2 base image through the image cache: the root disk is
	// an overlay on it, grown to diskGB.
	base := filepath.Join(t.TempDir(), "base.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", base, "64M").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	baseBytes, _ := os.ReadFile(base)
	img := srv.add("/base.qcow2", baseBytes)
	spec.Image = &img
	m := agent.Machine{Name: name, Dir: dir, Spec: spec, Volumes: []string{vol}, InstanceID: "i-lifecycle-1"}

	p := newTestProvisioner(t, cache, vmRoot, srv)
	t.Cleanup(func() { p.Destroy(context.Background(), name) })
	ctx := context.Background()
	if p.Running(name) {
		t.Fatal("running before boot")
	}
	// The first agent is a separate process that boots the VM and exits,
	// as an agent does when it is restarted: QEMU must outlive it.
	agentOut := runAgentProcess(t, helperJob{Machine: m, Cache: cache})
	if !p.Running(name) {
		t.Fatalf("the VM the exited agent booted is not running: %s\nagent said:\n%s", p.FailureReason(name), agentOut)
	}
	pid := p.machines[name].pid()
	if !strings.Contains(agentOut, fmt.Sprintf("booted pid=%d", pid)) {
		t.Fatalf("pidfile names %d, the exited agent said:\n%s", pid, agentOut)
	}

	t.Run("guest reads its seed, disks and network", func(t *testing.T) {
		lines := guestLines(waitSerial(t, dir, "tinyguest: ready"))
		want := []string{
			"instance-id=" + m.InstanceID + " hostname=" + name,
			"serial=gitfleet-root bytes=" + strconv.FormatInt(1*gib, 10),
			"serial=web-01-data bytes=" + strconv.Itoa(volBytes),
			"nic eth0 mac=" + macFor(name),
			"lease eth0 ip=" + GuestIP,
		}
		joined := strings.Join(lines, "\n")
		for _, w := range want {
			if !strings.Contains(joined, w) {
				t.Errorf("guest never said %q; it said:\n%s", w, joined)
			}
		}
	})

	t.Run("tiny guest is ready by its console marker, not by the forward", func(t *testing.T) {
		// p re-attached to a QEMU another process started: its probes
		// began at its first Readiness call.
		r := waitReady(t, p, name)
		if r.SSHRequired {
			t.Error("a guest given no SSH keys was taken for one reached by SSH")
		}
		if r.Via != agent.ReadyConsole {
			t.Errorf("ready via %q, want %q: the guest runs neither sshd nor a guest agent, so the forward that accepts and closes must not count", r.Via, agent.ReadyConsole)
		}
		if r.Booted.IsZero() || r.At.Before(r.Booted) {
			t.Errorf("booted %v, answered %v", r.Booted, r.At)
		}
		// Another restarted agent reads the answer of this boot at once.
		again := newTestProvisioner(t, cache, vmRoot, srv).Readiness(name)
		if !again.Ready || again.Via != r.Via || !again.At.Equal(r.At) {
			t.Errorf("after another restart Readiness = %+v, want the saved %+v", again, r)
		}
		// The guest agent's channel exists but nothing answers on it.
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := qgaCall(pctx, filepath.Join(dir, QGASocket), "guest-ping", nil, nil); err == nil {
			t.Error("guest-ping answered in a guest without qemu-guest-agent")
		}
	})

	t.Run("ssh port forwarded on loopback", func(t *testing.T) {
		addr := p.Address(name)
		port, err := readPort(filepath.Join(dir, PortFile))
		if err != nil || port == 0 {
			t.Fatalf("port file: %d %v", port, err)
		}
		if addr.SSH != fmt.Sprintf("127.0.0.1:%d", port) || addr.IP != GuestIP {
			t.Errorf("Address = %+v, want ssh 127.0.0.1:%d ip %s", addr, port, GuestIP)
		}
		c, err := net.DialTimeout("tcp", addr.SSH, 5*time.Second)
		if err != nil {
			t.Fatalf("nothing listens on the forwarded port: %v", err)
		}
		c.Close()
	})

	t.Run("agent restart re-attaches without rebooting", func(t *testing.T) {
		// p never booted this VM; it found it by pidfile, command line and QMP.
		if err := p.Boot(ctx, m); err != nil {
			t.Fatal(err)
		}
		if got := p.machines[name].pid(); got != pid {
			t.Errorf("pid %d after re-attach and Boot, want the original %d", got, pid)
		}
		if n := strings.Count(serial(dir), "tinyguest: init"); n != 1 {
			t.Errorf("guest booted %d times, want once", n)
		}
		st, err := qmpStatus(ctx, filepath.Join(dir, QMPSocket))
		if err != nil || st != "running" {
			t.Errorf("QMP query-status through the long socket path: %q %v", st, err)
		}
	})

	t.Run("root disk grows online with the spec", func(t *testing.T) {
		grown := m
		grown.Spec.DiskGB = 2
		if err := p.PrepareRootDisk(ctx, grown); err != nil {
			t.Fatal(err)
		}
		info, err := qemuImgInfo(ctx, "qemu-img", filepath.Join(dir, RootDiskFile), "qcow2")
		if err != nil {
			t.Fatal(err)
		}
		if info.VirtualSize != 2*gib {
			t.Errorf("root disk %d bytes after growing to 2 GiB", info.VirtualSize)
		}
		if got := p.machines[name].pid(); got != pid {
			t.Errorf("growing restarted QEMU: pid %d, was %d", got, pid)
		}
	})

	t.Run("graceful stop powers the guest off", func(t *testing.T) {
		if err := p.Shutdown(ctx, name); err != nil {
			t.Fatal(err)
		}
		if p.Running(name) {
			t.Fatal("running after Shutdown")
		}
		if r := p.Readiness(name); r != (agent.Readiness{}) {
			t.Errorf("Readiness of a stopped VM = %+v, want zero", r)
		}
		if !strings.Contains(serial(dir), "tinyguest: power button") {
			t.Errorf("guest never saw the ACPI power button: stop was not graceful\n%s", serial(dir))
		}
		if err := syscall.Kill(pid, 0); err == nil && cmdlineNames(pid, name, filepath.Join(dir, PidFile)) {
			t.Errorf("qemu pid %d still alive", pid)
		}
		if err := p.Shutdown(ctx, name); err != nil {
			t.Errorf("stopping a stopped VM: %v", err)
		}
	})

	t.Run("destroy leaves nothing but the volume", func(t *testing.T) {
		if err := p.Destroy(ctx, name); err != nil {
			t.Fatal(err)
		}
		if got := dirEntries(t, dir); len(got) != 1 || got[0] != filepath.Base(vol) {
			t.Errorf("after destroy the VM dir holds %v, want only the volume", got)
		}
		b, err := os.ReadFile(vol)
		if err != nil || len(b) != volBytes || !bytes.HasPrefix(b, []byte("guest data")) {
			t.Errorf("volume changed: %d bytes, err %v", len(b), err)
		}
		if err := p.Destroy(ctx, name); err != nil {
			t.Errorf("destroying an absent VM: %v", err)
		}
	})
}

// helperJob is what runAgentProcess hands the helper agent process.
type helperJob struct {
	Machine agent.Machine
	Cache   string
}

const helperEnv = "GITFLEET_QEMU_TEST_AGENT"

// runAgentProcess runs TestHelperAgentProcess in a child process that
// prepares and boots job's VM, then exits; it returns the child's output.
func runAgentProcess(t *testing.T, job helperJob) string {
	t.Helper()
	b, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperAgentProcess$", "-test.v")
	cmd.Env = append(os.Environ(), helperEnv+"="+string(b))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("agent process: %v\n%s", err, out)
	}
	return string(out)
}

// TestHelperAgentProcess is the body of the child process runAgentProcess
// starts; run on its own it skips.
func TestHelperAgentProcess(t *testing.T) {
	raw := os.Getenv(helperEnv)
	if raw == "" {
		t.Skip("helper: runs only as the agent process TestVMLifecycle starts")
	}
	var job helperJob
	if err := json.Unmarshal([]byte(raw), &job); err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{CacheDir: job.Cache, Accel: AccelTCG, Artifacts: loopbackPolicy(), BootTimeout: 60 * time.Second, Logger: quietLog().Logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := p.Preflight(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.PrepareRootDisk(ctx, job.Machine); err != nil {
		t.Fatal(err)
	}
	if err := p.Boot(ctx, job.Machine); err != nil {
		t.Fatalf("boot: %v", err)
	}
	fmt.Printf("booted pid=%d\n", p.machines[job.Machine.Name].pid())
}

func TestVMFailures(t *testing.T) {
	needQEMU(t)
	t.Parallel()
	srv := newArtifactServer(t)
	spec := guestSpec(t, srv)
	cache := t.TempDir()
	vmRoot := t.TempDir()
	ctx := context.Background()
	p := newTestProvisioner(t, cache, vmRoot, srv)

	t.Run("qemu refusing to start reports its own reason", func(t *testing.T) {
		name := "bad-kernel"
		junk := srv.add("/junk-kernel", []byte("this is not a kernel image"))
		bad := spec
		bad.Kernel = &desired.Kernel{URL: junk.URL, SHA256: junk.SHA256}
		m := agent.Machine{Name: name, Dir: filepath.Join(vmRoot, name), Spec: bad, InstanceID: "i-bad"}
		os.MkdirAll(m.Dir, 0o700)
		t.Cleanup(func() { p.Destroy(context.Background(), name) })
		if err := p.PrepareRootDisk(ctx, m); err != nil {
			t.Fatal(err)
		}
		err := p.Boot(ctx, m)
		if err == nil {
			t.Fatal("boot of a junk kernel succeeded")
		}
		reason := p.FailureReason(name)
		if !strings.Contains(reason, "kernel") || !strings.Contains(err.Error(), reason) {
			t.Errorf("boot error %q / failure reason %q: want QEMU's own message in both", err, reason)
		}
		if p.Running(name) {
			t.Error("running after a failed boot")
		}
	})

	t.Run("a killed qemu reads as failed with its reason", func(t *testing.T) {
		name := "killed"
		m := agent.Machine{Name: name, Dir: filepath.Join(vmRoot, name), Spec: spec, InstanceID: "i-killed"}
		os.MkdirAll(m.Dir, 0o700)
		t.Cleanup(func() { p.Destroy(context.Background(), name) })
		if err := p.PrepareRootDisk(ctx, m); err != nil {
			t.Fatal(err)
		}
		if err := p.Boot(ctx, m); err != nil {
			t.Fatal(err)
		}
		pid := p.machines[name].pid()
		if pid == 0 {
			t.Fatal("no pid")
		}
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(30 * time.Second); p.Running(name) && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		if p.Running(name) {
			t.Fatal("still running after SIGTERM")
		}
		if reason := p.FailureReason(name); !regexp.MustCompile(`terminating on signal 15`).MatchString(reason) {
			t.Errorf("failure reason %q, want QEMU's 'terminating on signal 15'", reason)
		}
		if a := p.Address(name); a.IP != "" {
			t.Errorf("dead VM reports IP %q", a.IP)
		}
		// It boots again on the same disk and port.
		port := p.Address(name).SSH
		if err := p.Boot(ctx, m); err != nil {
			t.Fatal(err)
		}
		if got := p.Address(name).SSH; got != port {
			t.Errorf("ssh port moved from %s to %s", port, got)
		}
		if p.FailureReason(name) != "" {
			t.Errorf("a fresh boot still reports the old failure %q", p.FailureReason(name))
		}
		waitSerial(t, m.Dir, "tinyguest: ready")

		// SIGKILL leaves QEMU no word to say; a restarted agent, which
		// never saw the exit status, still reports the VM as failed.
		pid = p.machines[name].pid()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		fresh := newTestProvisioner(t, cache, vmRoot, srv)
		for deadline := time.Now().Add(30 * time.Second); fresh.Running(name) && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		if fresh.Running(name) {
			t.Fatal("still running after SIGKILL")
		}
		if reason := fresh.FailureReason(name); !strings.Contains(reason, "gone without a message") {
			t.Errorf("after SIGKILL the failure reason is %q", reason)
		}
	})

	t.Run("a guest that ignores ACPI is quit after the powerdown timeout", func(t *testing.T) {
		// Without its initrd the kernel panics (no root) and never
		// handles the power button.
		name := "deaf"
		logger, hook := logtest.NewNullLogger()
		pq, err := New(Config{CacheDir: cache, Accel: AccelTCG, Artifacts: loopbackPolicy(), Logger: logger,
			PowerdownTimeout: 2 * time.Second, KillTimeout: 5 * time.Second, BootTimeout: 60 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		deaf := spec
		k := *spec.Kernel
		k.Initrd = nil
		deaf.Kernel = &k
		m := agent.Machine{Name: name, Dir: filepath.Join(vmRoot, name), Spec: deaf, InstanceID: "i-deaf"}
		os.MkdirAll(m.Dir, 0o700)
		t.Cleanup(func() { pq.Destroy(context.Background(), name) })
		if err := pq.PrepareRootDisk(ctx, m); err != nil {
			t.Fatal(err)
		}
		if err := pq.Boot(ctx, m); err != nil {
			t.Fatal(err)
		}
		if err := pq.Shutdown(ctx, name); err != nil {
			t.Fatal(err)
		}
		if pq.Running(name) {
			t.Fatal("running after Shutdown")
		}
		var stoppedBy string
		for _, e := range hook.AllEntries() {
			if e.Message == "qemu stopped" {
				stoppedBy, _ = e.Data["step"].(string)
			}
		}
		if stoppedBy != "quit" {
			t.Errorf("stopped by step %q, want quit (after the ignored powerdown)", stoppedBy)
		}
	})

	t.Run("wrong sha256 fails at once", func(t *testing.T) {
		name := "wrong-sum"
		bad := spec
		k := *spec.Kernel
		k.SHA256 = strings.Repeat("0", 64)
		bad.Kernel = &k
		m := agent.Machine{Name: name, Dir: filepath.Join(vmRoot, name), Spec: bad, InstanceID: "i-w"}
		os.MkdirAll(m.Dir, 0o700)
		err := p.PrepareRootDisk(ctx, m)
		if !agent.IsPermanent(err) || !strings.Contains(err.Error(), k.SHA256) {
			t.Errorf("error %v: want a permanent error naming the expected hash", err)
		}
		if strings.Contains(err.Error(), spec.Kernel.SHA256) {
			t.Errorf("error %v publishes the hash of what was received", err)
		}
		if _, err := os.Stat(filepath.Join(m.Dir, RootDiskFile)); !os.IsNotExist(err) {
			t.Errorf("root disk made despite the bad artifact: %v", err)
		}
	})
}

// BenchmarkBootToFirstSerialLine measures, under TCG, the time from the
// Boot call to the guest's first line on the serial console (and to the
// tiny guest's "ready", reported as ms-to-ready).
func BenchmarkBootToFirstSerialLine(b *testing.B) {
	needQEMU(b)
	srv := newArtifactServer(b)
	spec := guestSpec(b, srv)
	cache := b.TempDir()
	vmRoot := b.TempDir()
	p := newTestProvisioner(b, cache, vmRoot, srv)
	p.cfg.PowerdownTimeout = 10 * time.Second
	ctx := context.Background()
	var toReady time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		name := fmt.Sprintf("bench-%d", i)
		m := agent.Machine{Name: name, Dir: filepath.Join(vmRoot, name), Spec: spec, InstanceID: name}
		os.MkdirAll(m.Dir, 0o700)
		if err := p.PrepareRootDisk(ctx, m); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		if err := p.Boot(ctx, m); err != nil {
			b.Fatal(err)
		}
		for s := serial(m.Dir); lastBootOffset([]byte(s)) == int64(len(s)); s = serial(m.Dir) {
			time.Sleep(5 * time.Millisecond)
		}
		b.StopTimer()
		for !strings.Contains(serial(m.Dir), "tinyguest: ready") {
			time.Sleep(5 * time.Millisecond)
		}
		toReady += time.Since(start)
		if err := p.Destroy(ctx, name); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(toReady.Milliseconds())/float64(b.N), "ms-to-ready")
}
