package qemu

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
)

// testQEMUUser makes sure the dedicated QEMU user exists (the install step
// creates it on a host), or skips when it cannot be made.
func testQEMUUser(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: QEMU drops from root to " + DefaultQEMUUser)
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft not installed (apt-get install nftables)")
	}
	if _, err := user.Lookup(DefaultQEMUUser); err == nil {
		return
	}
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", DefaultQEMUUser).CombinedOutput(); err != nil {
		if _, lerr := user.Lookup(DefaultQEMUUser); lerr != nil {
			t.Fatalf("create %s: %v: %s", DefaultQEMUUser, err, out)
		}
	}
}

// procStatus reads the named fields of /proc/PID/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		out[k] = strings.Join(strings.Fields(v), " ")
	}
	return out
}

// A guest reaches its own SSH forward but no service on the host's
// loopback, and its QEMU runs as the unprivileged user under seccomp; it
// boots, is re-attached by a new provisioner, and stops.
func TestGuestCannotReachHostLoopback(t *testing.T) {
	needQEMU(t)
	testQEMUUser(t)
	hostSvc, hostConns := serveOn(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("host-only-secret\n"))
	}))
	port := hostSvc.Listener.Addr().(*net.TCPAddr).Port

	srv := newArtifactServer(t)
	spec := guestSpec(t, srv)
	spec.CloudInit = &desired.CloudInit{UserData: "#!/bin/sh\n" +
		"sleep 1\n" +
		// busybox-static's wget crashes resolving; nc speaks the HTTP.
		"out=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 10.0.2.2 " + strconv.Itoa(port) + " 2>&1)\n" +
		"case \"$out\" in *host-only-secret*) echo 'loopback reachable';; *) echo 'loopback refused';; esac\n" +
		"while true; do echo forward-ok | nc -l -p 22; done\n"}
	cache := t.TempDir()
	vmRoot := t.TempDir()
	name := "confined"
	dir := filepath.Join(vmRoot, name)
	os.MkdirAll(dir, 0o700)
	newProv := func() *Provisioner {
		p, err := New(Config{
			CacheDir: cache, Accel: AccelTCG, Artifacts: loopbackPolicy(), RunAs: DefaultQEMUUser,
			MachineDir:       func(n string) string { return filepath.Join(vmRoot, n) },
			PowerdownTimeout: 30 * time.Second, BootTimeout: 60 * time.Second, Logger: quietLog().Logger,
		})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := newProv()
	ctx := context.Background()
	if err := p.Preflight(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Destroy(context.Background(), name) })
	m := agent.Machine{Name: name, Dir: dir, Spec: spec, InstanceID: "i-confined"}
	if err := p.PrepareRootDisk(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := p.Boot(ctx, m); err != nil {
		t.Fatal(err)
	}

	s := waitSerial(t, dir, "probe loopback")
	if !strings.Contains(s, "probe loopback refused") {
		t.Errorf("the guest reached the host's 127.0.0.1:\n%s", strings.Join(guestLines(s), "\n"))
	}
	if n := hostConns.n.Load(); n != 0 {
		t.Errorf("the host-only service saw %d connections from the guest", n)
	}

	pid := p.machines[name].pid()
	st := procStatus(t, pid)
	if uid := strings.Fields(st["Uid"]); len(uid) != 4 || uid[0] != strconv.Itoa(p.user.uid) || uid[1] != uid[0] || uid[2] != uid[0] || uid[3] != uid[0] {
		t.Errorf("qemu runs with Uid %q, want all %d", st["Uid"], p.user.uid)
	}
	if st["Seccomp"] != "2" || st["NoNewPrivs"] != "1" {
		t.Errorf("qemu is not sandboxed: Seccomp %q NoNewPrivs %q", st["Seccomp"], st["NoNewPrivs"])
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("VM directory: %v, mode %v; want 0700", err, fi.Mode().Perm())
	}

	// The guest's own forward works: the host reaches the guest's port 22.
	ssh := p.Address(name).SSH
	var line string
	deadline := time.Now().Add(2 * time.Minute)
	for line == "" && time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", ssh, 5*time.Second); err == nil {
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			l, _ := bufio.NewReader(c).ReadString('\n')
			line = strings.TrimSpace(l)
			c.Close()
		}
		if line == "" {
			time.Sleep(500 * time.Millisecond)
		}
	}
	if line != "forward-ok" {
		t.Errorf("through the SSH forward %s: %q, want forward-ok", ssh, line)
	}

	// A new provisioner (an agent restart) re-attaches and stops it.
	p2 := newProv()
	if !p2.Running(name) {
		t.Fatal("a restarted agent does not find the confined VM")
	}
	if err := p2.Shutdown(ctx, name); err != nil {
		t.Fatal(err)
	}
	if p2.Running(name) {
		t.Error("still running after Shutdown")
	}
	if _, err := os.Stat(filepath.Join(dir, PidFile)); !os.IsNotExist(err) {
		t.Errorf("the unprivileged qemu left its pidfile: %v", err)
	}
}
