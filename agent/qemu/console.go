package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// The guest's first serial port is a QEMU socket chardev that QEMU serves
// on SerialSocket in the VM's directory and logs to SerialLog:
//
//	-chardev socket,id=console0,path=serial.sock,server=on,wait=off,logfile=<dir>/serial.log,logappend=on
//	-serial chardev:console0
//
// logappend=on makes QEMU open the log with O_APPEND instead of truncating
// it, so a restarted guest's output follows the previous boot's, after a
// BootMarker line the backend writes before each start. QEMU writes what
// the guest prints to the log whether or not a client is attached, and
// serves one client at a time: a further connection waits in the socket's
// backlog until the first one leaves. AttachConsole is that client; it
// takes ConsoleLock first, so a second gitfleet console is refused at once
// instead of waiting unseen.
const (
	// SerialSocket is the unix socket of the guest's first serial port.
	SerialSocket = "serial.sock"
	// SerialLogOld is the previous serial log, once SerialLog passed
	// SerialLogMax.
	SerialLogOld = SerialLog + ".1"
	// ConsoleLock is flocked by the one attached console.
	ConsoleLock = "console.lock"
	// BootMarker starts the line the backend appends to SerialLog before
	// each QEMU start, followed by the time (RFC 3339, UTC) and " ---".
	BootMarker = "--- gitfleet: boot "
)

// SerialLogMax is the size in bytes past which SerialLog is rotated to
// SerialLogOld (replacing the older one): before each boot, and every
// serialRotateEvery while the VM runs, when SerialLogOld keeps the last
// SerialLogMax bytes of the running log. A VM's console therefore takes at
// most about 2 × SerialLogMax (2 MiB) on disk, plus what the guest prints
// in one check interval.
const SerialLogMax int64 = 1 << 20

// serialRotateEvery is how often a running VM's serial log is checked.
const serialRotateEvery = 10 * time.Second

// consoleArgs renders the serial port's chardev: the socket relative to the
// VM's directory (QEMU's working directory, so a deep state directory never
// overflows sun_path), the log absolute.
func consoleArgs(dir string) []string {
	return []string{
		"-chardev", "socket,id=console0,path=" + SerialSocket + ",server=on,wait=off,logfile=" +
			escapeOpt(filepath.Join(dir, SerialLog)) + ",logappend=on",
		"-serial", "chardev:console0",
	}
}

// prepareSerialLog runs before QEMU starts: it rotates a log past
// SerialLogMax and appends a BootMarker line, starting on a line of its
// own, so each boot's output is found after its marker.
func prepareSerialLog(dir string, now time.Time) error {
	path := filepath.Join(dir, SerialLog)
	if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() && fi.Size() > SerialLogMax {
		if err := os.Rename(path, filepath.Join(dir, SerialLogOld)); err != nil {
			return fmt.Errorf("rotate serial log: %w", err)
		}
	}
	return appendBootMarker(path, now, "")
}

// appendBootMarker appends a BootMarker line for a boot that began at now
// to the serial log at path (created when missing), on a line of its
// own; note, when set, says more ("guest reset") before the closing
// " ---".
func appendBootMarker(path string, now time.Time, note string) error {
	f, err := openRegular(path, os.O_CREATE|os.O_APPEND|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("serial log: %w", err)
	}
	defer f.Close()
	line := BootMarker + now.UTC().Format(time.RFC3339)
	if note != "" {
		line += " (" + note + ")"
	}
	line += " ---\n"
	if fi, err := f.Stat(); err == nil && fi.Size() > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, fi.Size()-1); err == nil && last[0] != '\n' {
			line = "\n" + line
		}
	}
	if _, err := f.WriteString(line); err != nil {
		return fmt.Errorf("serial log: %w", err)
	}
	return nil
}

// rotateRunningSerialLog moves a running VM's log past SerialLogMax to
// SerialLogOld by copying it (as long as it was when checked) and
// truncating it in place: QEMU keeps its descriptor, opened with O_APPEND,
// and goes on writing at the new end. What the guest prints between the
// check and the truncation is lost; that is the price of never
// interrupting QEMU.
func rotateRunningSerialLog(dir string) error {
	path := filepath.Join(dir, SerialLog)
	if fi, err := os.Lstat(path); err != nil || fi.Size() <= SerialLogMax {
		return nil
	}
	src, err := openRegular(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("rotate serial log: %w", err)
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return fmt.Errorf("rotate serial log: %w", err)
	}
	old := filepath.Join(dir, SerialLogOld)
	tmp := old + ".partial"
	dst, err := createRegular(tmp, 0o600)
	if err != nil {
		return fmt.Errorf("rotate serial log: %w", err)
	}
	// What the guest prints during the copy is not waited for: a guest
	// that prints faster than the copy runs would keep it going for ever.
	// Only the last SerialLogMax bytes are kept: QEMU may have set the
	// file's size (its descriptor can), and a copy of a huge, sparse log
	// would have the agent write all of it.
	keep := min(fi.Size(), SerialLogMax)
	_, err = io.Copy(dst, io.NewSectionReader(src, fi.Size()-keep, keep))
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, old)
	}
	if err == nil {
		err = src.Truncate(0)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("rotate serial log: %w", err)
	}
	return nil
}

// rotateLoop keeps the serial log in dir under its cap until ctx ends.
func (p *Provisioner) rotateLoop(ctx context.Context, st *vmState) {
	t := time.NewTicker(serialRotateEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := rotateRunningSerialLog(st.dir); err != nil {
			p.log.WithField("vm", st.name).WithError(err).Warn("serial log")
		}
	}
}

// lastBootOffset is the offset just past the last BootMarker line of a
// serial log (0 when it has none: a log rotated since the boot began holds
// only that boot).
func lastBootOffset(log []byte) int64 {
	i := bytes.LastIndex(log, []byte(BootMarker))
	if i < 0 || (i > 0 && log[i-1] != '\n') {
		return 0
	}
	end := bytes.IndexByte(log[i:], '\n')
	if end < 0 {
		return int64(len(log))
	}
	return int64(i + end + 1)
}

// ErrConsoleBusy is AttachConsole's error when another console holds the
// VM's serial port.
var ErrConsoleBusy = errors.New("console in use")

// ConsoleEscape is the byte that detaches an interactive console: Ctrl-].
const ConsoleEscape = 0x1d

// AttachConsole connects in and out to the serial port of the running VM
// whose directory is dir, until in ends, in sends ConsoleEscape, QEMU
// closes the port (the VM stopped) or ctx ends. One console at a time: a
// second one fails at once with ErrConsoleBusy, naming the pid that holds
// it. QEMU logs the guest's output to SerialLog meanwhile, as always. It
// fails when the VM does not run (no socket answers).
func AttachConsole(ctx context.Context, dir string, in io.Reader, out io.Writer) error {
	lock, err := openRegular(filepath.Join(dir, ConsoleLock), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			b := make([]byte, 32)
			n, _ := lock.ReadAt(b, 0)
			return fmt.Errorf("%w: attached by pid %s", ErrConsoleBusy, bytes.TrimSpace(b[:n]))
		}
		return fmt.Errorf("console: lock: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if err := lock.Truncate(0); err == nil {
		lock.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	conn, err := dialSocket(dctx, filepath.Join(dir, SerialSocket))
	cancel()
	if err != nil {
		return fmt.Errorf("console: the VM's serial port does not answer (is it running?): %w", err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	done := make(chan error, 2)
	go func() {
		_, err := io.Copy(out, conn)
		done <- err
	}()
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := in.Read(buf)
			if i := bytes.IndexByte(buf[:n], ConsoleEscape); i >= 0 {
				conn.Write(buf[:i])
				done <- nil
				return
			}
			if n > 0 {
				if _, werr := conn.Write(buf[:n]); werr != nil {
					done <- werr
					return
				}
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				done <- err
				return
			}
		}
	}()
	err = <-done
	if ctx.Err() != nil {
		return nil
	}
	if err != nil && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("console: %w", err)
	}
	return nil
}
