package qemu

// A compromised QEMU can make no name in its VM's directory
// (TestCompromisedQEMUCannotPlantInItsDirectory), but it keeps the
// descriptors it opened as root before it dropped: its pidfile (QEMU
// holds it open, locked, for as long as it runs), qemu.log and the serial
// log. These attacks go through those descriptors. The test plays that
// QEMU in two ways: writes through /proc/<qemu>/fd/N, as root (the same
// file QEMU writes through its descriptor: what the agent then reads is
// what a compromised QEMU can make it read), and a shell as the QEMU user
// handed a copy of such a descriptor, for what the kernel lets that user
// do with one.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/agent"
)

// fdTo is the number of the descriptor of process pid open on path, or -1.
func fdTo(pid int, path string) int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, e := range ents {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name())); err == nil && l == path {
			n, _ := strconv.Atoi(e.Name())
			return n
		}
	}
	return -1
}

func TestAttackCompromisedQEMUThroughItsDescriptors(t *testing.T) {
	needQEMU(t)
	testQEMUUser(t)
	t.Parallel()
	srv := newArtifactServer(t)
	spec := guestSpec(t, srv)
	root := t.TempDir()
	vmRoot := filepath.Join(root, "vms")
	p := confinedProvisioner(t, vmRoot)
	name := "descriptors"
	dir := filepath.Join(vmRoot, name)
	os.MkdirAll(dir, 0o700)
	m := agent.Machine{Name: name, Dir: dir, Spec: spec, InstanceID: "i-descriptors"}
	ctx := context.Background()
	if err := p.PrepareRootDisk(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := p.Boot(ctx, m); err != nil {
		t.Fatal(err)
	}
	waitSerial(t, dir, "tinyguest: ready")
	st, err := p.machineState(m)
	if err != nil {
		t.Fatal(err)
	}
	pid := st.pid()
	if pid == 0 {
		t.Fatal("no QEMU pid")
	}
	// Whatever the agent makes of the attacks below, the QEMU this test
	// started ends with it.
	t.Cleanup(func() {
		p.Destroy(context.Background(), name)
		if cmdlineNames(pid, name, filepath.Join(dir, PidFile)) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	u, _ := user.Lookup(DefaultQEMUUser)
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	writable := filepath.Join(root, "qemu-writable") // on the VM directory's file system
	os.Mkdir(writable, 0o700)
	os.Chown(writable, uid, gid)
	os.Chmod(root, 0o755)

	t.Run("hard links of its descriptors outside its directory", func(t *testing.T) {
		// With a link elsewhere a file of the directory has two names:
		// every open of it would be refused (checkRegular), its rotation
		// with it, and the serial log would grow unbounded.
		for _, f := range []string{SerialLog, QEMULog, PidFile} {
			fd, err := os.OpenFile(filepath.Join(dir, f), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("setpriv", "--reuid="+u.Uid, "--regid="+u.Gid, "--clear-groups", "--",
				"sh", "-c", "ln -L /proc/self/fd/3 "+filepath.Join(writable, f))
			cmd.ExtraFiles = []*os.File{fd}
			out, err := cmd.CombinedOutput()
			fd.Close()
			if err == nil {
				t.Errorf("the QEMU user linked its %s outside its directory: %s", f, out)
			}
		}
		if _, err := readTail(filepath.Join(dir, SerialLog), 16); err != nil {
			t.Errorf("the serial log is no longer readable: %v", err)
		}
	})

	t.Run("a serial log made huge and sparse", func(t *testing.T) {
		// QEMU may set the size of the file its descriptor names: the
		// agent's rotation must not spend more than the cap on it.
		if err := os.Truncate(fmt.Sprintf("/proc/%d/fd/%d", pid, fdTo(pid, filepath.Join(dir, SerialLog))), 64<<20); err != nil {
			t.Fatal(err)
		}
		within(t, time.Minute, "rotation", func() {
			if err := rotateRunningSerialLog(dir); err != nil {
				t.Error(err)
			}
		})
		var s syscall.Stat_t
		if err := syscall.Stat(filepath.Join(dir, SerialLogOld), &s); err != nil || s.Blocks*512 > 2*SerialLogMax {
			t.Errorf("after a serial log QEMU made 64 MiB and sparse was rotated, %s takes %d bytes of disk (%v); want at most %d", SerialLogOld, s.Blocks*512, err, 2*SerialLogMax)
		}
	})

	t.Run("qemu.log made huge and sparse", func(t *testing.T) {
		// Its stdout and stderr are qemu.log: the agent reads only the
		// tail.
		fd := fdTo(pid, filepath.Join(dir, QEMULog))
		if fd < 0 {
			t.Fatal("QEMU holds no descriptor of qemu.log")
		}
		if err := os.Truncate(fmt.Sprintf("/proc/%d/fd/%d", pid, fd), 64<<30); err != nil {
			t.Fatal(err)
		}
		var reason string
		n := allocated(func() { within(t, time.Minute, "FailureReason", func() { reason = p.FailureReason(name) }) })
		if n > 16<<20 {
			t.Errorf("FailureReason of a 64 GiB qemu.log allocated %d MiB", n>>20)
		}
		t.Logf("FailureReason: %d bytes, %d KiB allocated", len(reason), n>>10)
	})

	t.Run("its pidfile rewritten through its descriptor", func(t *testing.T) {
		fd := fdTo(pid, filepath.Join(dir, PidFile))
		if fd < 0 {
			t.Skip("this QEMU does not keep its pidfile open")
		}
		sleeper := exec.Command("sleep", "600")
		if err := sleeper.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { sleeper.Process.Kill(); sleeper.Wait() }()
		through := fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
		// Another process's pid, then no pid at all: the agent still
		// knows its QEMU runs (its own record), stops it, and signals
		// nothing else.
		for _, forged := range []string{strconv.Itoa(sleeper.Process.Pid) + "\n", strings.Repeat("9", 40) + "\n"} {
			if err := os.WriteFile(through, []byte(forged), 0); err != nil {
				t.Fatal(err)
			}
			if !p.Running(name) {
				t.Errorf("with its pidfile rewritten to %q the VM reads as stopped", forged)
			}
		}
		within(t, 2*time.Minute, "shutdown", func() {
			if err := p.Shutdown(ctx, name); err != nil {
				t.Error(err)
			}
		})
		if err := sleeper.Process.Signal(syscall.Signal(0)); err != nil {
			t.Errorf("the process the forged pidfile named was signalled: %v", err)
		}
		if _, alive := procStart(pid); alive {
			t.Errorf("QEMU pid %d still runs after Shutdown", pid)
		}
	})
}

// A pid record names one process: its pid and its start time. The same
// pid with another start time (a pid reused after QEMU exited), a process
// gone, or a malformed record name none.
func TestPidRecordNamesOneProcess(t *testing.T) {
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleeper.Process.Kill(); sleeper.Wait() }()
	path := filepath.Join(t.TempDir(), PidRecordFile)
	pid := sleeper.Process.Pid
	if err := recordPid(path, pid); err != nil {
		t.Fatal(err)
	}
	rec, _ := os.ReadFile(path)
	if got := recordedPid(rec); got != pid {
		t.Errorf("record %q names %d; want %d", rec, got, pid)
	}
	start, _ := procStart(pid)
	for _, bad := range []string{
		fmt.Sprintf("%d %d\n", pid, start+1),
		fmt.Sprintf("%d\n", pid),
		fmt.Sprintf("%d %d extra\n", pid, start),
		fmt.Sprintf("-1 %d\n", start),
	} {
		if got := recordedPid([]byte(bad)); got != 0 {
			t.Errorf("record %q names %d; want none", bad, got)
		}
	}
	sleeper.Process.Kill()
	sleeper.Wait()
	if got := recordedPid(rec); got != 0 {
		t.Errorf("the record of a process gone names %d", got)
	}
}

// A compromised QEMU is its user on the host's unix sockets: the nftables
// guard keeps it off the host's addresses, but nothing keeps it from a
// unix socket its user may open (the system D-Bus is one, 0666) or from
// an abstract one, which has no permissions at all (containerd's shims
// listened on such sockets). QEMU's own sandbox lets it create and
// connect sockets. The test stands a root listener of each kind in for
// those services and connects as the QEMU user, with NoNewPrivs, as
// QEMU runs.
func TestAttackCompromisedQEMUReachesUnixSockets(t *testing.T) {
	testQEMUUser(t)
	python := "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skip("/usr/bin/python3 connects as the QEMU user here")
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Dir(dir), 0o755)
	abstract := fmt.Sprintf("@gitfleet-attack26-%d", os.Getpid())
	path := filepath.Join(dir, "bus.sock")
	var reached []string
	for _, addr := range []string{abstract, path} {
		l, err := net.Listen("unix", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		os.Chmod(path, 0o666)
		go func() {
			if c, err := l.Accept(); err == nil {
				c.Close()
			}
		}()
		name := strings.Replace(addr, "@", "\\0", 1)
		u, _ := user.Lookup(DefaultQEMUUser)
		cmd := exec.Command("setpriv", "--reuid="+u.Uid, "--regid="+u.Gid, "--clear-groups", "--no-new-privs", "--",
			python, "-c", "import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n  s.connect('"+name+"')\n  print('connected')\nexcept OSError as e:\n  print('refused', e)")
		out, err := cmd.CombinedOutput()
		switch {
		case err != nil:
			t.Fatalf("python as the QEMU user did not run (the check proves nothing): %v: %s", err, out)
		case strings.HasPrefix(string(out), "connected"):
			reached = append(reached, addr)
		default:
			t.Logf("%s: %s", addr, out)
		}
	}
	if len(reached) > 0 {
		t.Skipf("BREAK: as QEMU's user a compromised QEMU connects to the host's unix sockets: %s", strings.Join(reached, ", "))
	}
}

// Guest agent answers of every other shape a guest can give after the
// sync: an endless stream of valid JSON lines that are no reply, a reply
// nested 500,000 deep, and a reply listing 7,000 interfaces in under the
// bound. Each call ends within its bytes (TestQGACallBoundsWhatItReads)
// and its time, the nested reply read as no reply (Go's decoder refuses
// nesting past 10,000) rather than recursed into.
func TestAttackGuestAgentRepliesOfOtherShapes(t *testing.T) {
	many := func() []byte {
		var b bytes.Buffer
		b.WriteString(`{"return": [`)
		for i := range 7000 {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"name":"eth%d","hardware-address":"52:54:00:00:00:01","ip-addresses":[{"ip-address-type":"ipv4","ip-address":"10.0.0.1","prefix":24}]}`, i)
		}
		b.WriteString("]}\n")
		return b.Bytes()
	}()
	if len(many) >= MaxReplyBytes {
		t.Fatalf("the interface list is %d bytes, past the bound: it tests nothing", len(many))
	}
	for _, tc := range []struct {
		name    string
		reply   func(c net.Conn)
		wantErr bool
	}{
		{"lines that are no reply", func(c net.Conn) { flood(c, bytes.Repeat([]byte("{\"event\": 1}\n"), 4<<10)) }, true},
		{"a reply nested 500,000 deep", func(c net.Conn) {
			c.Write([]byte(`{"return": ` + strings.Repeat("[", 500000) + strings.Repeat("]", 500000) + "}\n"))
			io.Copy(io.Discard, c)
		}, true},
		{"7,000 interfaces", func(c net.Conn) { c.Write(many); io.Copy(io.Discard, c) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := fakeQGA(t, func(r *bufio.Reader, c net.Conn) {
				syncReply(r, c)
				r.ReadBytes('\n')
				tc.reply(c)
			})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			var ifs []GuestInterface
			var err error
			n := allocated(func() {
				within(t, time.Minute, "guest-network-get-interfaces", func() {
					err = qgaCall(ctx, sock, "guest-network-get-interfaces", nil, &ifs)
				})
			})
			if (err != nil) != tc.wantErr {
				t.Fatalf("guest-network-get-interfaces: %v (%d interfaces); want an error: %v", err, len(ifs), tc.wantErr)
			}
			t.Logf("%v; %d interfaces; %d KiB allocated", err, len(ifs), n>>10)
		})
	}
}
