// Package nspawn boots a Debian root filesystem under systemd-nspawn with
// systemd as PID 1, so tests can run gitfleet's shipped systemd units
// (examples/systemd) under the real service manager: Type=notify, the
// watchdog, KillMode, transient scopes, TimeoutStopSec.
//
// BuildRootfs runs scripts/build-systemd-rootfs.sh, which builds the tree
// from Debian packages (mmdebstrap) and caches it keyed on the script's own
// text, so only the first build on a machine spends minutes and network.
// Boot starts a container on that tree:
//
//   - read-only with a tmpfs overlay on top (--volatile=overlay), so the
//     cached tree is shared by every run and never changes;
//   - with a network namespace of its own holding only a loopback device
//     (--private-network): nothing in it reaches the host's network or any
//     other; Listen opens a socket inside it for the test's servers;
//   - not registered with systemd-machined (--register=no), in a cgroup of
//     its own (--keep-unit): where systemd is the host's init, a delegated
//     transient scope (systemd-run --scope); elsewhere a cgroup Boot makes
//     under each mounted hierarchy, removed by Close.
//
// Exec runs a command inside every namespace of the container (nsenter), as
// root, so `systemctl`, `journalctl` and `kill` see what the container's
// systemd sees. Close powers the container off, and kills it when it does
// not halt in time. Boot and Close need root.
package nspawn

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Script is the path of scripts/build-systemd-rootfs.sh in the source tree
// this package was built from.
func Script() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "scripts", "build-systemd-rootfs.sh")
}

// Missing names what this host lacks to build the tree and boot it (""
// when nothing): root, systemd-nspawn, nsenter, mmdebstrap, flock, or a
// mounted cgroup hierarchy. Tests skip with it.
func Missing() string {
	if os.Geteuid() != 0 {
		return "root (systemd-nspawn, mmdebstrap --mode=root)"
	}
	for _, tool := range []string{"systemd-nspawn", "nsenter", "mmdebstrap", "flock"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " (scripts/install-deps.sh installs it)"
		}
	}
	if len(cgroupRoots()) == 0 {
		return "a mounted cgroup hierarchy (/sys/fs/cgroup)"
	}
	return ""
}

// BuildRootfs finds or builds the tree under cacheDir and returns the path
// of its root directory. A cold build takes minutes and fetches packages
// through the host's apt sources; a warm one reads a directory. Concurrent
// builds, also from separate processes, serialize on a lock in cacheDir. It
// fails with the tail of the script's output when the build does.
func BuildRootfs(ctx context.Context, cacheDir string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", Script(), cacheDir)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build systemd rootfs: %s: %v: %s", Script(), err, bytes.TrimSpace(tail(errb.Bytes(), 2048)))
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	root := filepath.Join(lines[len(lines)-1], "rootfs")
	if _, err := os.Stat(filepath.Join(root, "usr", "lib", "systemd", "systemd")); err != nil {
		return "", fmt.Errorf("build systemd rootfs: %s holds no systemd: %w", root, err)
	}
	return root, nil
}

// TestCacheDir is where test suites build the tree and keep it across
// runs: $GITFLEET_TEST_CACHE/nspawn, or <user cache dir>/gitfleet-test/nspawn
// (os.UserCacheDir, falling back to the temporary directory), beside the
// test guests'.
func TestCacheDir() string {
	if d := os.Getenv("GITFLEET_TEST_CACHE"); d != "" {
		return filepath.Join(d, "nspawn")
	}
	d, err := os.UserCacheDir()
	if err != nil {
		d = os.TempDir()
	}
	return filepath.Join(d, "gitfleet-test", "nspawn")
}

// Bind is a host path mounted into the container (--bind or --bind-ro).
// Both paths are absolute; Container is created when absent.
type Bind struct {
	Host, Container string
	ReadOnly        bool
}

// Config is a container to boot.
type Config struct {
	// Rootfs is the tree to boot (BuildRootfs); it is only read.
	Rootfs string
	// Binds are mounted into the container.
	Binds []Bind
	// Console receives the container's console: systemd's boot and
	// shutdown messages. Nil discards them.
	Console io.Writer
	// BootTimeout bounds the wait for systemd to finish booting (default
	// 2 min); it only ends a broken boot.
	BootTimeout time.Duration
}

// Machine is a booted container. Its methods are safe for concurrent use;
// Close is called once.
type Machine struct {
	// Name is the container's machine name, unique per Boot
	// ("gf-nspawn-<hex>").
	Name string
	// Leader is the host's pid of the container's PID 1 (systemd).
	Leader int

	cmd     *exec.Cmd
	done    chan struct{}
	cgroups []string // made by Boot, removed by Close
}

// Boot starts a container on cfg.Rootfs and waits until its systemd has
// finished booting (`systemctl is-system-running --wait` answers running
// or degraded). On an error nothing of the container is left.
func Boot(ctx context.Context, cfg Config) (*Machine, error) {
	if cfg.BootTimeout == 0 {
		cfg.BootTimeout = 2 * time.Minute
	}
	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		return nil, err
	}
	m := &Machine{Name: "gf-nspawn-" + hex.EncodeToString(suffix), done: make(chan struct{})}
	args := []string{"--quiet", "--boot", "--machine", m.Name, "--directory", cfg.Rootfs,
		"--volatile=overlay", "--private-network", "--register=no"}
	for _, b := range cfg.Binds {
		opt := "--bind="
		if b.ReadOnly {
			opt = "--bind-ro="
		}
		args = append(args, opt+b.Host+":"+b.Container)
	}
	// The container keeps the cgroup nspawn starts in (--keep-unit), one
	// of its own so that nspawn's payload and supervisor cgroups are
	// too: where systemd is the host's init, a delegated transient scope
	// (systemd-run reaches it on its private socket, no D-Bus needed);
	// elsewhere a cgroup made here under each mounted hierarchy.
	args = append(args, "--keep-unit")
	script := `exec systemd-nspawn "$@"`
	if hostSystemd() {
		script = `exec systemd-run --scope --quiet --collect --property=Delegate=yes --unit="$0" -- systemd-nspawn "$@"`
	} else {
		for _, root := range cgroupRoots() {
			dir := filepath.Join(root, m.Name)
			if err := os.Mkdir(dir, 0o755); err != nil {
				m.removeCgroups()
				return nil, fmt.Errorf("nspawn: cgroup for %s: %w", m.Name, err)
			}
			m.cgroups = append(m.cgroups, dir)
			script = "echo $$ >" + dir + "/cgroup.procs && " + script
		}
	}
	m.cmd = exec.Command("sh", "-c", script, m.Name+".scope")
	m.cmd.Args = append(m.cmd.Args, args...)
	m.cmd.Stdout, m.cmd.Stderr = cfg.Console, cfg.Console
	if cfg.Console == nil {
		m.cmd.Stdout, m.cmd.Stderr = io.Discard, io.Discard
	}
	// A pipe as stdin: nspawn does not treat the test's terminal, if any,
	// as the container's console.
	m.cmd.Stdin = strings.NewReader("")
	// Should the test process die, so does nspawn, and with it the container.
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	m.cmd.Env = append(os.Environ(), "SYSTEMD_LOG_COLOR=0")
	if err := m.cmd.Start(); err != nil {
		m.removeCgroups()
		return nil, fmt.Errorf("nspawn: start: %w", err)
	}
	go func() {
		_ = m.cmd.Wait()
		close(m.done)
	}()
	if err := m.waitBooted(ctx, cfg.BootTimeout); err != nil {
		_ = m.Close()
		return nil, err
	}
	return m, nil
}

// waitBooted finds the container's PID 1 and waits for its boot to finish.
func (m *Machine) waitBooted(ctx context.Context, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	last := ""
	for {
		select {
		case <-m.done:
			return fmt.Errorf("nspawn %s: exited during boot: %v", m.Name, m.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("nspawn %s: not booted after %s: %s", m.Name, limit, last)
		case <-time.After(200 * time.Millisecond):
		}
		if m.Leader == 0 {
			m.Leader = containerInit(m.cmd.Process.Pid)
			last = "no PID 1 yet"
			continue
		}
		out, _ := m.Exec(ctx, "systemctl", "is-system-running", "--wait")
		state := strings.TrimSpace(string(out))
		if state == "running" || state == "degraded" {
			return nil
		}
		last = "system " + state
	}
}

// containerInit is the pid of the container's PID 1 among nspawn's
// children (the process whose innermost pid is 1), or 0.
func containerInit(nspawnPid int) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := os.Open(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		ppid, nspid := 0, ""
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "PPid:"); ok {
				ppid, _ = strconv.Atoi(strings.TrimSpace(v))
			}
			if v, ok := strings.CutPrefix(sc.Text(), "NSpid:"); ok {
				nspid = strings.TrimSpace(v)
			}
		}
		f.Close()
		if ppid == nspawnPid && strings.HasSuffix(nspid, "\t1") {
			return pid
		}
	}
	return 0
}

// Exec runs args inside the container (every namespace of its PID 1) as
// root, with a plain environment (PATH, LANG=C.UTF-8, no pager, no colour)
// and returns its combined output. A failure's error carries the command
// and its output.
func (m *Machine) Exec(ctx context.Context, args ...string) ([]byte, error) {
	if m.Leader == 0 {
		return nil, fmt.Errorf("nspawn %s: not booted", m.Name)
	}
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--target", strconv.Itoa(m.Leader), "--all", "--"}, args...)...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
		"SYSTEMD_PAGER=", "SYSTEMD_COLORS=0", "TERM=dumb"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("in %s: %s: %w: %s", m.Name, strings.Join(args, " "), err, bytes.TrimSpace(tail(out, 2048)))
	}
	return out, nil
}

// Listen opens a TCP listener on addr (such as "127.0.0.1:0") inside the
// container's network namespace: a server of the test's, serving from the
// test process, that the container reaches on its own loopback while
// nothing outside can. The listener is the caller's to close.
func (m *Machine) Listen(addr string) (net.Listener, error) {
	target, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", m.Leader))
	if err != nil {
		return nil, fmt.Errorf("nspawn %s: %w", m.Name, err)
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
		return nil, fmt.Errorf("nspawn %s: listen %s: %w", m.Name, addr, r.err)
	}
	return r.l, nil
}

// Close powers the container off (SIGRTMIN+4 to its systemd, as
// `machinectl poweroff` does) and waits up to a minute for nspawn to exit,
// then kills the container's PID 1, which ends every process in it. It
// removes the cgroups Boot made. An error says what was left.
func (m *Machine) Close() error {
	if m.Leader != 0 {
		_ = syscall.Kill(m.Leader, sigPoweroff)
	}
	select {
	case <-m.done:
	case <-time.After(time.Minute):
		if m.Leader != 0 {
			_ = syscall.Kill(m.Leader, syscall.SIGKILL)
		}
		_ = m.cmd.Process.Kill()
		select {
		case <-m.done:
		case <-time.After(30 * time.Second):
			return fmt.Errorf("nspawn %s: did not exit", m.Name)
		}
	}
	return m.removeCgroups()
}

// removeCgroups removes the cgroups Boot made, deepest first (nspawn
// leaves its payload and supervisor cgroups in them).
func (m *Machine) removeCgroups() error {
	var errs []error
	for _, dir := range m.cgroups {
		var dirs []string
		_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// sigPoweroff asks systemd as PID 1 to power off (SIGRTMIN+4, systemd(1)).
const sigPoweroff = syscall.Signal(34 + 4)

// hostSystemd reports whether systemd is the host's init
// (/run/systemd/system exists, as sd_booted(3) checks).
func hostSystemd() bool {
	_, err := os.Stat("/run/systemd/system")
	return err == nil
}

// cgroupRoots are the mounted hierarchies a container's cgroup is made in
// when no systemd does it: the unified (cgroup2) one and systemd's named
// v1 one, where mounted.
func cgroupRoots() []string {
	var roots []string
	for _, dir := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd"} {
		if isCgroupMount(dir) {
			roots = append(roots, dir)
		}
	}
	if len(roots) == 0 && isCgroupMount("/sys/fs/cgroup") {
		roots = append(roots, "/sys/fs/cgroup")
	}
	return roots
}

func isCgroupMount(dir string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false
	}
	return st.Type == unix.CGROUP2_SUPER_MAGIC || st.Type == unix.CGROUP_SUPER_MAGIC
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
