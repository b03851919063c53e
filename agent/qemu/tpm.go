package qemu

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gitfleet/gitfleet/agent"
)

// Files of a VM's TPM in its directory.
const (
	// TPMDir holds the VM's TPM 2.0 state (swtpm's tpm2-00.permall):
	// mode 0700, owned by QEMU's user, whom swtpm runs as, with the state
	// file 0600 inside. Only this VM's swtpm ever opens it.
	TPMDir = "tpm"
	// SWTPMPidFile is the pid of the VM's swtpm, written by the agent.
	SWTPMPidFile = "swtpm.pid"
	// SWTPMLog is swtpm's own log, made anew at each start.
	SWTPMLog = "swtpm.log"
)

// tpmStateFile is swtpm's permanent state of a TPM 2.0 in TPMDir.
const tpmStateFile = "tpm2-00.permall"

// MachineStateFiles are the names, in a VM's directory, of the state its
// machine keeps besides its disks: the UEFI variables (boot entries,
// Secure Boot keys) and the TPM's state (its keys, sealed secrets). They
// belong with the root disk: a backup or a move that carries the disk
// must carry these too, or the guest boots with no boot entry and finds
// a TPM that unseals nothing.
var MachineStateFiles = []string{UEFIVarsFile, TPMDir}

// ErrTPMState is wrapped when a VM's TPM state cannot be used as it is
// (not a directory of ours, a state file swtpm's user cannot read, a
// state that vanished from a TPM that ran): the backend never starts the
// VM with a fresh TPM in its place. Permanent until someone repairs or
// removes the state.
var ErrTPMState = errors.New("TPM state unusable")

// tpmOwner is the uid and gid swtpm runs as and its state belongs to:
// QEMU's user, or the agent's own when QEMU runs as it.
func (p *Provisioner) tpmOwner() (uid, gid int) {
	if p.user != nil {
		return p.user.uid, p.user.gid
	}
	return os.Geteuid(), os.Getegid()
}

// prepareTPM makes the VM's TPMDir when it has none, a new TPM
// (manufactureTPM), and otherwise checks it: a directory, not a link,
// owned by the TPM's user, mode 0700, holding the state file, a regular
// file with one link, owned by that user, mode 0600. A TPMDir without its
// state has lost it, and is refused: the VM is never given a fresh TPM in
// its place.
func (p *Provisioner) prepareTPM(ctx context.Context, st *vmState) error {
	dir := st.path(TPMDir)
	uid, _ := p.tpmOwner()
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return p.manufactureTPM(ctx, st)
	}
	if err != nil {
		return fmt.Errorf("tpm: %w", err)
	}
	if err := checkOwned(dir, fi, true, uid); err != nil {
		return err
	}
	state := filepath.Join(dir, tpmStateFile)
	fi, err = os.Lstat(state)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return agent.Permanent(fmt.Errorf("%w: %s holds no %s: the TPM's state is lost, and the VM is not given a fresh TPM in its place (restore it, or remove %s to start a new TPM)", ErrTPMState, dir, tpmStateFile, dir))
	case err != nil:
		return fmt.Errorf("tpm: %w", err)
	}
	return checkOwned(state, fi, false, uid)
}

// manufactureTPM makes a new TPM 2.0 state for the VM with swtpm_setup
// (its SHA-256 PCR bank only: the firmware hashes what it measures once
// per active bank, in software, which under TCG is most of its boot) in
// TPMDir.partial, gives it to the TPM's user (0700, files 0600), and
// renames it to TPMDir, so a TPMDir always holds a whole state.
func (p *Provisioner) manufactureTPM(ctx context.Context, st *vmState) error {
	tmp, dir := st.path(TPMDir+".partial"), st.path(TPMDir)
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("tpm: %w", err)
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return fmt.Errorf("tpm: %w", err)
	}
	defer os.RemoveAll(tmp)
	abs, err := filepath.Abs(tmp)
	if err != nil {
		return fmt.Errorf("tpm: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, p.cfg.SWTPMSetup, "--tpm2", "--tpmstate", abs, "--pcr-banks", "sha256", "--not-overwrite").CombinedOutput()
	if err != nil {
		return fmt.Errorf("tpm: %s: %v: %s", p.cfg.SWTPMSetup, err, trimTail(out, 512))
	}
	uid, gid := p.tpmOwner()
	es, err := os.ReadDir(tmp)
	if err != nil {
		return fmt.Errorf("tpm: %w", err)
	}
	for _, e := range append(es, nil) {
		path, mode := tmp, fs.FileMode(0o700)
		if e != nil {
			path, mode = filepath.Join(tmp, e.Name()), 0o600
			if !e.Type().IsRegular() {
				return fmt.Errorf("tpm: %s made %s, not a regular file", p.cfg.SWTPMSetup, path)
			}
		}
		if err := os.Lchown(path, uid, gid); err != nil {
			return fmt.Errorf("tpm: %w", err)
		}
		if err := os.Chmod(path, mode); err != nil {
			return fmt.Errorf("tpm: %w", err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("tpm: %w", err)
	}
	return nil
}

// checkOwned refuses, wrapping ErrTPMState, fi at path unless it is a
// directory (dir) or a regular file with one link, owned by uid, of mode
// 0700 or 0600.
func checkOwned(path string, fi fs.FileInfo, dir bool, uid int) error {
	want, kind := fs.FileMode(0o600), "a regular file"
	ok := fi.Mode().IsRegular() && checkRegular(path, fi) == nil
	if dir {
		want, kind, ok = 0o700, "a directory", fi.IsDir()
	}
	if !ok {
		return agent.Permanent(fmt.Errorf("%w: %s is %s, want %s", ErrTPMState, path, fileKind(fi.Mode()), kind))
	}
	if owner := int(fi.Sys().(*syscall.Stat_t).Uid); owner != uid {
		return agent.Permanent(fmt.Errorf("%w: %s belongs to uid %d, want %d (swtpm's user)", ErrTPMState, path, owner, uid))
	}
	if fi.Mode().Perm() != want {
		return agent.Permanent(fmt.Errorf("%w: %s has mode %04o, want %04o", ErrTPMState, path, fi.Mode().Perm(), want))
	}
	return nil
}

// swtpm is a started swtpm: its process and the QEMU end of its control
// channel, handed to QEMU as a file descriptor.
type swtpm struct {
	cmd  *exec.Cmd
	qemu *os.File
}

// startSWTPM starts the VM's swtpm ("swtpm socket --tpm2") before QEMU:
// its working directory is the VM's TPMDir (so, once it dropped to the
// TPM's user, it reaches its state without traversing the agent's VM
// directory), its control channel one end of a socket pair whose other
// end QEMU gets, its log SWTPMLog. With --terminate it exits when QEMU
// closes the channel, so it never outlives its QEMU; the agent also
// stops it with the VM (stopSWTPM). Its pid goes to SWTPMPidFile.
func (p *Provisioner) startSWTPM(st *vmState) (*swtpm, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("swtpm: socketpair: %w", err)
	}
	ours, qemu := os.NewFile(uintptr(fds[0]), "swtpm-ctrl"), os.NewFile(uintptr(fds[1]), "swtpm-qemu")
	defer ours.Close()
	logf, err := createRegular(st.path(SWTPMLog), 0o600)
	if err != nil {
		qemu.Close()
		return nil, fmt.Errorf("swtpm log: %w", err)
	}
	defer logf.Close()
	args := []string{"socket", "--tpm2", "--tpmstate", "dir=.,mode=0600",
		"--ctrl", "type=unixio,clientfd=3", "--log", "fd=4,level=1", "--terminate"}
	if p.user != nil {
		args = append(args, "--runas", p.user.name)
	}
	cmd := exec.Command(p.cfg.SWTPM, args...)
	cmd.Dir = st.path(TPMDir)
	cmd.ExtraFiles = []*os.File{ours, logf}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		qemu.Close()
		return nil, fmt.Errorf("start %s: %w", p.cfg.SWTPM, err)
	}
	go cmd.Wait() // reaped whenever it exits; stopSWTPM finds it by pidfile
	if err := writeAtomic(st.path(SWTPMPidFile), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600); err != nil {
		cmd.Process.Kill()
		qemu.Close()
		return nil, fmt.Errorf("swtpm pidfile: %w", err)
	}
	return &swtpm{cmd: cmd, qemu: qemu}, nil
}

// swtpmPid is the pid of the VM's swtpm when it runs, 0 otherwise: the
// pidfile's process must be an swtpm whose working directory is this
// VM's TPMDir, so a reused pid never reads as it.
func (st *vmState) swtpmPid() int {
	b, err := readRegular(st.path(SWTPMPidFile), 32)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(filepath.Base(strings.SplitN(string(cmdline), "\x00", 2)[0]), "swtpm") {
		return 0
	}
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	want, aerr := filepath.Abs(st.path(TPMDir))
	if err != nil || aerr != nil || cwd != want {
		return 0
	}
	return pid
}

// swtpmLost reports whether the VM was started with a swtpm (its
// pidfile is there: written at the start, removed at the stop) that no
// longer runs while its QEMU does.
func (st *vmState) swtpmLost() bool {
	if _, err := os.Lstat(st.path(SWTPMPidFile)); err != nil {
		return false
	}
	return st.swtpmPid() == 0 && st.pid() != 0
}

// stopSWTPM ends the VM's swtpm when one still runs (SIGTERM, then
// SIGKILL after a second) and removes its pidfile. It runs once QEMU is
// gone, and after a QEMU that failed to start.
func (st *vmState) stopSWTPM() {
	pid := st.swtpmPid()
	if pid != 0 {
		syscall.Kill(pid, syscall.SIGTERM)
		for i := 0; i < 20 && st.swtpmPid() != 0; i++ {
			time.Sleep(50 * time.Millisecond)
		}
		if st.swtpmPid() != 0 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	os.Remove(st.path(SWTPMPidFile))
}

// swtpmLogTail is the last KiB of swtpm's log, for a boot's error.
func swtpmLogTail(st *vmState) string {
	b, _ := readTail(st.path(SWTPMLog), 1<<10)
	return strings.TrimSpace(string(trimTail(b, 1024)))
}
