package qemu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gitfleet/gitfleet/agent"
)

// Disk streams are read from an NBD export with nbdcopy (libnbd-bin),
// which writes the export's bytes in order to its standard output when
// that is a pipe. The export is QEMU's own (a running VM's snapshot) or a
// qemu-nbd's (a stopped VM's disk, a free volume: qemu-nbd opens the file
// read-only and takes QEMU's image lock, so a disk a running QEMU holds
// is refused).
const (
	nbdcopyBin = "nbdcopy"
	qemuNBDBin = "qemu-nbd"
	// nbdRequest is nbdcopy's request size: its streaming mode has one
	// request in flight.
	nbdRequest = 4 << 20
	// nbdExitTimeout bounds the wait for nbdcopy (and qemu-nbd) to exit
	// once the stream's bytes are all read.
	nbdExitTimeout = 30 * time.Second
)

// diskStream is an agent.DiskStream over nbdcopy's standard output.
type diskStream struct {
	size  int64
	out   *os.File
	procs []*exec.Cmd
	done  chan struct{} // nbdcopy exited
	werr  error         // nbdcopy's cmd.Wait, once done
	errs  *tailWriter
	stop  func() bool
	post  func() // removes what the stream made, after its processes

	mu     sync.Mutex
	h      hash.Hash
	n      int64
	sum    string
	err    error
	closed bool
}

var _ agent.DiskStream = (*diskStream)(nil)

func (s *diskStream) Size() int64 { return s.size }

// SHA256 is the hex sha256 of the whole stream, "" until Read returned
// io.EOF.
func (s *diskStream) SHA256() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sum
}

func (s *diskStream) Read(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.err != nil:
		return 0, s.err
	case s.sum != "":
		return 0, io.EOF
	case s.closed:
		return 0, os.ErrClosed
	}
	n, err := s.out.Read(b)
	if int64(n) > s.size-s.n {
		s.err = fmt.Errorf("nbd stream longer than the disk's %d bytes", s.size)
		return 0, s.err
	}
	s.h.Write(b[:n])
	s.n += int64(n)
	switch {
	case errors.Is(err, io.EOF):
		return n, s.finish()
	case err != nil:
		s.err = fmt.Errorf("read nbdcopy's output: %w", err)
		return n, s.err
	}
	return n, nil
}

// finish is Read at the end of nbdcopy's output: io.EOF when nbdcopy
// exited 0 after exactly size bytes, else the error (kept).
func (s *diskStream) finish() error {
	select {
	case <-s.done:
	case <-time.After(nbdExitTimeout):
		s.stop()
		<-s.done
		s.err = fmt.Errorf("nbdcopy did not exit within %s of its end", nbdExitTimeout)
		return s.err
	}
	switch {
	case s.werr != nil:
		s.err = fmt.Errorf("nbdcopy: %v: %s", s.werr, s.errs.String())
	case s.n != s.size:
		s.err = fmt.Errorf("nbd stream ended after %d of the disk's %d bytes", s.n, s.size)
	default:
		s.sum = hex.EncodeToString(s.h.Sum(nil))
		return io.EOF
	}
	return s.err
}

// Close stops nbdcopy (and qemu-nbd) if they still run, waits for them,
// and removes what the stream made. Idempotent.
func (s *diskStream) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.stop()
	s.out.Close()
	if s.post != nil {
		s.post()
	}
	return nil
}

func (s *diskStream) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// tailWriter keeps the last 1 KiB written to it (a process's stderr).
type tailWriter struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 4096 {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-1024:]...)
	}
	return len(p), nil
}

func (t *tailWriter) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(trimTail(t.buf, 1024))
}

// nbdStream starts nbdcopy reading export of the NBD server at socket
// to a pipe; files are given to nbdcopy from descriptor 3 on (a socket
// opened by the caller is reached as /proc/self/fd/3). ctx's end stops
// it; extra processes (qemu-nbd) are stopped with it.
func nbdStream(ctx context.Context, socket string, files []*os.File, export string, size int64, extra ...*exec.Cmd) (*diskStream, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errs := &tailWriter{}
	cmd := exec.Command(nbdcopyBin, fmt.Sprintf("--request-size=%d", nbdRequest), "nbd+unix:///"+export+"?socket="+socket, "-")
	cmd.ExtraFiles = files
	cmd.Stdout, cmd.Stderr = w, errs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("start %s: %w", nbdcopyBin, err)
	}
	w.Close()
	s := &diskStream{size: size, out: r, procs: append([]*exec.Cmd{cmd}, extra...), done: make(chan struct{}), errs: errs, h: sha256.New()}
	go func() { s.werr = cmd.Wait(); close(s.done) }()
	var once sync.Once
	s.stop = func() bool {
		once.Do(func() {
			for _, c := range s.procs {
				syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			}
			<-s.done
			for _, c := range extra {
				c.Wait()
			}
		})
		return true
	}
	context.AfterFunc(ctx, func() { s.stop() })
	return s, nil
}

// fileStream serves the disk file at path (opened here: no symbolic
// link, a regular file writable by no one but root) read-only with
// qemu-nbd and streams it with nbdcopy. format is "raw" or "qcow2"; a
// qcow2's backing file, if its header names one, must be an image of the
// cache, and is opened here and given to qemu-nbd explicitly, so a header
// rewritten to name another file is refused rather than followed.
func (p *Provisioner) fileStream(ctx context.Context, path, format, export string) (*diskStream, error) {
	f, err := openDisk(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size, backing, err := p.diskGeometry(f, format)
	if err != nil {
		return nil, fmt.Errorf("disk %s: %w", path, err)
	}
	files := []*os.File{f}
	opts := "driver=" + format + ",file.driver=file,file.filename=/dev/fd/3"
	if backing != "" {
		bf, err := openDisk(backing)
		if err != nil {
			return nil, err
		}
		defer bf.Close()
		bfmt, err := inspectImage(backing)
		if err != nil {
			return nil, err
		}
		files = append(files, bf)
		opts += ",backing.driver=" + bfmt + ",backing.file.driver=file,backing.file.filename=/dev/fd/4"
	}
	dir, err := os.MkdirTemp("", "gitfleet-nbd-")
	if err != nil {
		return nil, err
	}
	srv, err := startQEMUNBD(ctx, dir, export, opts, files)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s, err := nbdStream(ctx, filepath.Join(dir, "nbd.sock"), nil, export, size, srv)
	if err != nil {
		syscall.Kill(-srv.Process.Pid, syscall.SIGKILL)
		srv.Wait()
		os.RemoveAll(dir)
		return nil, err
	}
	s.post = func() { os.RemoveAll(dir) }
	return s, nil
}

// startQEMUNBD runs qemu-nbd on dir/nbd.sock for one client and waits
// (at most 10 s) for its socket. A lock another QEMU holds on the image
// is agent.ErrDiskInUse.
func startQEMUNBD(ctx context.Context, dir, export, opts string, files []*os.File) (*exec.Cmd, error) {
	errs := &tailWriter{}
	cmd := exec.Command(qemuNBDBin, "--read-only", "--shared=1", "--socket="+filepath.Join(dir, "nbd.sock"),
		"--export-name="+export, "--image-opts", opts)
	cmd.ExtraFiles = files
	cmd.Stdout, cmd.Stderr = errs, errs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", qemuNBDBin, err)
	}
	sock := filepath.Join(dir, "nbd.sock")
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if _, err := os.Stat(sock); err == nil {
			return cmd, nil
		}
		var info unix.Siginfo
		if err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil); err == nil && info.Signo != 0 {
			werr := cmd.Wait()
			out := errs.String()
			if strings.Contains(out, "lock") {
				return nil, fmt.Errorf("%w: %s", agent.ErrDiskInUse, out)
			}
			return nil, fmt.Errorf("%s: %v: %s", qemuNBDBin, werr, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	cmd.Wait()
	return nil, fmt.Errorf("%s did not serve within 10 s: %s", qemuNBDBin, errs.String())
}

// openVMSocket opens the unix socket dir/name without following a link
// (O_PATH) and checks it is a socket of uid: nbdcopy then connects to
// that very socket through /proc/self/fd, whatever QEMU's user does to
// the name meanwhile.
func openVMSocket(dir, name string, uid int) (*os.File, error) {
	dfd, err := openVMDir(dir)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK || int(st.Uid) != uid {
		unix.Close(fd)
		return nil, fmt.Errorf("%s is not a socket of uid %d", name, uid)
	}
	return os.NewFile(uintptr(fd), name), nil
}
