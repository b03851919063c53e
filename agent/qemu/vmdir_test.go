package qemu

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
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
	"github.com/gitfleet/gitfleet/desired"
)

// A compromised QEMU runs as the QEMU user with the VM's directory as its
// working directory (the agent starts it there): whatever that user can
// make at a name in that directory, the root agent, and QEMU itself
// before it drops root, would open at the next start. These tests play
// that QEMU with setpriv: a shell as the QEMU user, started in the VM's
// directory while root, as QEMU is.

// asQEMUUser runs script with sh as DefaultQEMUUser in dir, entered
// while root (as QEMU's working directory is), and returns its output
// and error.
func asQEMUUser(t *testing.T, dir, script string) (string, error) {
	t.Helper()
	u, err := user.Lookup(DefaultQEMUUser)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("setpriv", "--reuid="+u.Uid, "--regid="+u.Gid, "--clear-groups", "--", "sh", "-c", script)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// victim is a root-only file outside every VM's directory, with content
// the tests check is never changed.
func victim(t *testing.T, name string) (path string, content []byte) {
	t.Helper()
	dir := t.TempDir()
	path = filepath.Join(dir, name)
	content = []byte("root's own " + name + ", never to be written by gitfleet\n")
	if err := os.WriteFile(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, content
}

func assertUnchanged(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("%s was written through a planted link: now %q (err %v), was %q", path, got, err, want)
	}
}

// unblockFIFO opens the FIFO at path for writing and closes it, which
// ends a reader's open blocked on it, and removes it (so a failed test
// can clean up).
func unblockFIFO(path string) {
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&fs.ModeNamedPipe == 0 {
		return
	}
	if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
		f.Close()
	}
	os.Remove(path)
}

// confinedProvisioner is a provisioner as a root agent runs it: QEMU as
// DefaultQEMUUser, under its sandbox.
func confinedProvisioner(t *testing.T, vmRoot string) *Provisioner {
	t.Helper()
	p, err := New(Config{
		CacheDir: t.TempDir(), Accel: AccelTCG, Artifacts: loopbackPolicy(), RunAs: DefaultQEMUUser,
		MachineDir:       func(n string) string { return filepath.Join(vmRoot, n) },
		PowerdownTimeout: 2 * time.Second, KillTimeout: 2 * time.Second, BootTimeout: 60 * time.Second,
		Logger: quietLog().Logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Preflight(context.Background()); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCompromisedQEMUCannotPlantInItsDirectory: the VM's directory is
// root's, so the QEMU user can make nothing there: no symbolic link for
// the agent to truncate (qemu.log) or append to as root (serial.log), no
// FIFO for it to block on (qemu.pid). Every file in it is root's.
func TestCompromisedQEMUCannotPlantInItsDirectory(t *testing.T) {
	needQEMU(t)
	testQEMUUser(t)
	t.Parallel()
	srv := newArtifactServer(t)
	spec := guestSpec(t, srv)
	vmRoot := t.TempDir()
	p := confinedProvisioner(t, vmRoot)
	name := "planted"
	dir := filepath.Join(vmRoot, name)
	os.MkdirAll(dir, 0o700)
	m := agent.Machine{Name: name, Dir: dir, Spec: spec, InstanceID: "i-planted"}
	t.Cleanup(func() { p.Destroy(context.Background(), name) })
	t.Cleanup(func() { unblockFIFO(filepath.Join(dir, PidFile)) })
	ctx := context.Background()
	if err := p.PrepareRootDisk(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := p.Boot(ctx, m); err != nil {
		t.Fatal(err)
	}
	waitSerial(t, dir, "tinyguest: ready")

	assertRootsOnly(t, dir)
	logVictim, logWas := victim(t, "log-victim")
	serialVictim, serialWas := victim(t, "serial-victim")
	for _, plant := range []string{
		"ln -sf " + logVictim + " " + QEMULog,
		"ln -sf " + serialVictim + " " + SerialLog,
		"ln -sf " + logVictim + " " + ReadyFile + ".partial",
	} {
		if out, err := asQEMUUser(t, dir, plant); err == nil {
			t.Errorf("the QEMU user could %q in its VM's directory: %s", plant, out)
		}
	}
	// A boot after the plants neither truncates nor appends to what
	// they name.
	within(t, 3*time.Minute, "shutdown and boot", func() {
		if err := p.Shutdown(ctx, name); err != nil {
			t.Error(err)
		}
		if err := p.Boot(ctx, m); err != nil {
			t.Error(err)
		}
	})
	waitReady(t, p, name)
	assertUnchanged(t, logVictim, logWas)
	assertUnchanged(t, serialVictim, serialWas)

	if out, err := asQEMUUser(t, dir, "rm -f "+PidFile+" && mkfifo "+PidFile); err == nil {
		t.Errorf("the QEMU user replaced its pidfile by a FIFO: %s", out)
	}
	within(t, time.Minute, "Running, Readiness, FailureReason", func() {
		if !p.Running(name) {
			t.Error("the VM does not read as running")
		}
		p.Readiness(name)
		p.FailureReason(name)
	})
	assertRootsOnly(t, dir)
}

// assertRootsOnly checks that dir is root's, mode 0700, and holds only
// files of root's.
func assertRootsOnly(t *testing.T, dir string) {
	t.Helper()
	fi, err := os.Lstat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 || fi.Mode().Perm() != 0o700 {
		t.Errorf("VM directory: uid %d, mode %v; want root's, 0700", st.Uid, fi.Mode().Perm())
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		info, err := e.Info()
		if err != nil {
			continue
		}
		if st := info.Sys().(*syscall.Stat_t); st.Uid != 0 {
			t.Errorf("%s in the VM directory belongs to uid %d", e.Name(), st.Uid)
		}
	}
}

// TestPlantsLeftInAGivenDirectoryAreNeverFollowed: a VM directory an
// earlier version gave to the QEMU user may hold what a compromised QEMU
// put there: symbolic links at every name the agent writes, FIFOs at the
// names it reads. An agent (re)started on it takes the directory back and
// removes them, follows none, blocks on none, and boots the VM. Planted
// where that sweep does not look (a directory root already owns), each
// open refuses or replaces them by itself.
func TestPlantsLeftInAGivenDirectoryAreNeverFollowed(t *testing.T) {
	needQEMU(t)
	testQEMUUser(t)
	t.Parallel()
	srv := newArtifactServer(t)
	spec := guestSpec(t, srv)
	target, was := victim(t, "victim")
	links := []string{QEMULog, SerialLogOld + ".partial", ConsoleLock, ReadyFile + ".partial", PortFile + ".partial", SeedFile + ".partial"}
	fifos := []string{PidFile, ReadyFile}
	t.Run("given to the QEMU user by an earlier version", func(t *testing.T) {
		plantAndBoot(t, spec, target,
			append(links, SerialLog, PortFile, RootDiskFile+".partial"), append(fifos, NetFile), true)
		assertUnchanged(t, target, was)
	})
	t.Run("in a directory root owns", func(t *testing.T) {
		plantAndBoot(t, spec, target, links, fifos, false)
		assertUnchanged(t, target, was)
	})
}

// plantAndBoot prepares a VM's root disk, plants symbolic links to target
// at links and FIFOs at fifos in its directory (as the QEMU user in a
// directory given to it when given, else as root), then runs a new
// provisioner on it as an agent started on it would: its reads return,
// it boots the VM, and a console attaches (or is refused, naming the
// lock, when it is a link not swept).
func plantAndBoot(t *testing.T, spec desired.VMSpec, target string, links, fifos []string, given bool) {
	vmRoot := t.TempDir()
	name := "planted"
	dir := filepath.Join(vmRoot, name)
	os.MkdirAll(dir, 0o700)
	m := agent.Machine{Name: name, Dir: dir, Spec: spec, InstanceID: "i-planted"}
	ctx := context.Background()
	if err := confinedProvisioner(t, vmRoot).PrepareRootDisk(ctx, m); err != nil {
		t.Fatal(err)
	}
	var script []string
	for _, l := range links {
		script = append(script, "ln -sf "+target+" "+l)
	}
	for _, f := range fifos {
		script = append(script, "rm -f "+f, "mkfifo "+f)
	}
	plant := func() (string, error) {
		cmd := exec.Command("sh", "-c", strings.Join(script, " && "))
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if given {
		u, _ := user.Lookup(DefaultQEMUUser)
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		plant = func() (string, error) { return asQEMUUser(t, dir, strings.Join(script, " && ")) }
	}
	if out, err := plant(); err != nil {
		t.Fatalf("plant: %v: %s", err, out)
	}
	p := confinedProvisioner(t, vmRoot)
	t.Cleanup(func() {
		for _, f := range fifos {
			unblockFIFO(filepath.Join(dir, f))
		}
		p.Destroy(context.Background(), name)
	})
	within(t, time.Minute, "Running, Readiness, Address, FailureReason", func() {
		if p.Running(name) {
			t.Error("a FIFO for a pidfile reads as a running VM")
		}
		p.Readiness(name)
		p.Address(name)
		p.FailureReason(name)
	})
	within(t, 3*time.Minute, "boot", func() {
		if err := p.Boot(ctx, m); err != nil {
			t.Errorf("boot: %v", err)
		}
	})
	waitReady(t, p, name)
	within(t, time.Minute, "console", func() {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		// Refused, when not swept: the lock is a symbolic link.
		err := AttachConsole(cctx, dir, strings.NewReader(""), &bytes.Buffer{})
		if err != nil && (given || !errors.Is(err, ErrUnsafeFile)) {
			t.Errorf("console: %v", err)
		}
	})
	assertRootsOnly(t, dir)
	for _, name := range append(links, fifos...) {
		if fi, err := os.Lstat(filepath.Join(dir, name)); err == nil && !fi.Mode().IsRegular() && given {
			t.Errorf("%s is still %s", name, fileKind(fi.Mode()))
		}
	}
}

// rebase rewrites the backing file named in the header of the qcow2 at
// disk without touching its data (qemu-img rebase -u), as QEMU, which
// writes the root disk, can.
func rebase(t *testing.T, disk, backing, format string) {
	t.Helper()
	if out, err := exec.Command("qemu-img", "rebase", "-u", "-f", "qcow2", "-b", backing, "-F", format, disk).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img rebase: %v: %s", err, out)
	}
}

// forgeDataFile makes the qcow2 at disk keep its data in the raw file at
// data (an external data file, data_file_raw): the header QEMU would
// write for that.
func forgeDataFile(t *testing.T, disk, data string) {
	t.Helper()
	scratch := filepath.Join(filepath.Dir(data), strings.Repeat("s", len(filepath.Base(data))))
	tmp := filepath.Join(t.TempDir(), "forged.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-o", "data_file="+scratch+",data_file_raw=on", tmp, "1G").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	b, err := os.ReadFile(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(disk, bytes.Replace(b, []byte(scratch), []byte(data), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(scratch)
}

// TestRootDiskHeaderNamingHostFilesIsRefused: QEMU writes the root disk,
// header included, so a compromised one can make it name any file as its
// backing file or external data file, which QEMU would open as root at
// the next boot and show the guest (or let it write). The agent reads the
// header first and refuses to boot such a disk; the guest, which prints
// the first bytes of its disk, never sees the file.
func TestRootDiskHeaderNamingHostFilesIsRefused(t *testing.T) {
	needQEMU(t)
	t.Parallel()
	srv := newArtifactServer(t)
	spec := guestSpec(t, srv)
	spec.CloudInit = &desired.CloudInit{UserData: "#!/bin/sh\necho \"disk says $(head -c 48 /dev/vda | tr -c 'a-z ' .)\"\n"}
	secret, _ := victim(t, "secret")
	for _, tc := range []struct {
		name  string
		forge func(t *testing.T, disk string)
		want  string
	}{
		{"backing file", func(t *testing.T, disk string) { rebase(t, disk, secret, "raw") }, "backing file"},
		{"external data file", func(t *testing.T, disk string) { forgeDataFile(t, disk, secret) }, "data file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vmRoot := t.TempDir()
			p := newTestProvisioner(t, t.TempDir(), vmRoot, srv)
			name := "forged"
			m := agent.Machine{Name: name, Dir: filepath.Join(vmRoot, name), Spec: spec, InstanceID: "i-forged"}
			os.MkdirAll(m.Dir, 0o700)
			t.Cleanup(func() { p.Destroy(context.Background(), name) })
			ctx := context.Background()
			if err := p.PrepareRootDisk(ctx, m); err != nil {
				t.Fatal(err)
			}
			tc.forge(t, filepath.Join(m.Dir, RootDiskFile))
			err := p.Boot(ctx, m)
			if err == nil {
				s := waitSerial(t, m.Dir, "probe disk says")
				t.Fatalf("a root disk whose header names %s booted; the guest says:\n%s", secret, strings.Join(guestLines(s), "\n"))
			}
			if !errors.Is(err, ErrImageNotSelfContained) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("boot: %v; want %v naming the %s", err, ErrImageNotSelfContained, tc.want)
			}
			if err := p.PrepareRootDisk(ctx, m); !errors.Is(err, ErrImageNotSelfContained) {
				t.Errorf("prepare root disk (qemu-img would open what the header names): %v", err)
			}
		})
	}
}

// TestVMFileHelpersRefuseWhatTheBackendDoesNotMake pins the helpers every
// open in a VM's directory goes through.
func TestVMFileHelpersRefuseWhatTheBackendDoesNotMake(t *testing.T) {
	dir := t.TempDir()
	target, was := victim(t, "target")
	regular := filepath.Join(dir, "regular")
	os.WriteFile(regular, []byte("12345\n"), 0o600)
	link := filepath.Join(dir, "link")
	os.Symlink(target, link)
	fifo := filepath.Join(dir, "fifo")
	syscall.Mkfifo(fifo, 0o600)
	t.Cleanup(func() { unblockFIFO(fifo) })
	hard := filepath.Join(dir, "hard")
	os.Link(target, hard)
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o700)

	for _, path := range []string{link, fifo, hard, sub} {
		within(t, 10*time.Second, "open "+path, func() {
			if _, err := readRegular(path, 1<<10); !errors.Is(err, ErrUnsafeFile) {
				t.Errorf("readRegular(%s): %v, want %v", filepath.Base(path), err, ErrUnsafeFile)
			}
			if f, err := openRegular(path, os.O_CREATE|os.O_RDWR, 0o600); !errors.Is(err, ErrUnsafeFile) {
				f.Close()
				t.Errorf("openRegular(%s, O_CREATE): %v, want %v", filepath.Base(path), err, ErrUnsafeFile)
			}
		})
	}
	if b, err := readRegular(regular, 1<<10); err != nil || string(b) != "12345\n" {
		t.Errorf("readRegular(regular) = %q, %v", b, err)
	}
	if _, err := readRegular(regular, 3); err == nil {
		t.Error("readRegular past its bound succeeded")
	}
	if err := writeAtomic(link, []byte("new"), 0o600); err != nil {
		t.Errorf("writeAtomic over a link: %v", err)
	}
	if fi, _ := os.Lstat(link); !fi.Mode().IsRegular() {
		t.Errorf("writeAtomic left %s", fileKind(fi.Mode()))
	}
	f, err := createRegular(hard, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("new")
	f.Close()
	assertUnchanged(t, target, was)

	if _, err := dialSocket(context.Background(), link); !errors.Is(err, ErrUnsafeFile) {
		t.Errorf("dialSocket(link): %v", err)
	}
	if _, err := dialSocket(context.Background(), regular); !errors.Is(err, ErrUnsafeFile) {
		t.Errorf("dialSocket(regular file): %v", err)
	}
}
