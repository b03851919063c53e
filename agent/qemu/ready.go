package qemu

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/agent"
)

// Timings of the readiness probes. Each way (SSH, guest agent, console) is
// probed on its own goroutine, one probe at a time, ProbeInterval after
// the last one ended; every probe is bounded.
const (
	ProbeInterval    = 200 * time.Millisecond
	sshDialTimeout   = time.Second
	sshBannerTimeout = 5 * time.Second // sshd re-execs per connection: slow under TCG
	qgaPingTimeout   = 2 * time.Second
)

// bootWatch probes one boot of a VM (one QEMU process, by pid) until its
// guest answers or the process is gone. The first answer is kept in memory
// and in ReadyFile, so an agent restarted during the same boot reads the
// guest as ready at once.
type bootWatch struct {
	pid    int
	cancel context.CancelFunc

	mu sync.Mutex
	r  agent.Readiness
}

func (w *bootWatch) readiness() agent.Readiness {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.r
}

// Readiness implements agent.Provisioner: what the probes of the VM's
// current boot found. It starts the probes when none run for the live
// QEMU (after an agent restart), and reads files only (the pidfile, /proc
// and ReadyFile), never the guest.
func (p *Provisioner) Readiness(name string) agent.Readiness {
	st := p.state(name, "")
	if st == nil {
		return agent.Readiness{}
	}
	pid := st.pid()
	if pid == 0 {
		st.stopWatch()
		return agent.Readiness{}
	}
	return p.watch(st, pid).readiness()
}

// watch returns the bootWatch of the QEMU with pid, starting it when the
// VM has none for that pid.
func (p *Provisioner) watch(st *vmState, pid int) *bootWatch {
	st.watchMu.Lock()
	defer st.watchMu.Unlock()
	if w := st.watch; w != nil && w.pid == pid {
		return w
	}
	if st.watch != nil {
		st.watch.cancel()
	}
	w := &bootWatch{pid: pid}
	w.r.Booted = bootTime(st)
	if r, ok := readReadyFile(st.path(ReadyFile), pid); ok {
		r.Booted = w.r.Booted
		w.r = r
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	st.watch = w
	if !w.r.Ready {
		log := p.log.WithField("vm", st.name)
		for via, probe := range map[string]func(context.Context) (string, error){
			agent.ReadySSH:        func(ctx context.Context) (string, error) { return p.probeSSH(ctx, st.name) },
			agent.ReadyGuestAgent: func(ctx context.Context) (string, error) { return "", p.probeQGA(ctx, st) },
			agent.ReadyConsole:    newConsoleScan(st.path(SerialLog)).probe,
		} {
			go p.probeLoop(ctx, st, w, via, probe, log)
		}
	}
	return w
}

// stopWatch ends the probes of the VM's boot, if any.
func (st *vmState) stopWatch() {
	st.watchMu.Lock()
	defer st.watchMu.Unlock()
	if st.watch != nil {
		st.watch.cancel()
		st.watch = nil
	}
}

// bootTime is when the VM's QEMU started: its pidfile's modification time
// (QEMU writes it at start; Boot removes an old one first).
func bootTime(st *vmState) time.Time {
	if fi, err := os.Stat(st.path(PidFile)); err == nil {
		return fi.ModTime()
	}
	return time.Now()
}

// probeLoop runs probe every ProbeInterval until it succeeds, another way
// succeeds, or ctx ends; the first success makes the boot ready.
func (p *Provisioner) probeLoop(ctx context.Context, st *vmState, w *bootWatch, via string, probe func(context.Context) (string, error), log *logrus.Entry) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		addr, err := probe(ctx)
		if err == nil {
			w.mu.Lock()
			first := !w.r.Ready
			if first {
				w.r.Ready, w.r.At, w.r.Via, w.r.Addr = true, time.Now(), via, addr
				if err := writeReadyFile(st.path(ReadyFile), w.pid, w.r); err != nil {
					log.WithError(err).Warn("save readiness")
				}
			}
			r := w.r
			w.mu.Unlock()
			if first {
				log.WithFields(logrus.Fields{"via": via, "addr": addr, "seconds": r.At.Sub(r.Booted).Seconds()}).Info("guest answered")
			}
			w.cancel()
			return
		}
		t.Reset(ProbeInterval)
	}
}

// probeSSH reads the SSH identification line from the guest's port 22 at
// the address Address reports (its forward on 127.0.0.1 under user-mode
// networking). A forward accepts connections before the guest listens and
// then closes them, so only the "SSH-" line counts.
func (p *Provisioner) probeSSH(ctx context.Context, name string) (string, error) {
	addr := p.Address(name).SSH
	if addr == "" {
		return "", fmt.Errorf("no ssh address yet")
	}
	return addr, sshBanner(ctx, addr)
}

// sshBanner dials addr and reads its first line, which must start with
// "SSH-" (RFC 4253 section 4.2; a server may send other lines first, which
// are skipped).
func sshBanner(ctx context.Context, addr string) error {
	d := net.Dialer{Timeout: sshDialTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(sshBannerTimeout))
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	r := bufio.NewReaderSize(conn, 256)
	for i := 0; i < 8; i++ {
		line, err := r.ReadString('\n')
		if strings.HasPrefix(line, "SSH-") {
			return nil
		}
		if err != nil {
			return fmt.Errorf("ssh banner from %s: %w", addr, err)
		}
	}
	return fmt.Errorf("ssh banner from %s: none in the first lines", addr)
}

// probeQGA pings the guest agent.
func (p *Provisioner) probeQGA(ctx context.Context, st *vmState) error {
	st.qgaMu.Lock()
	defer st.qgaMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, qgaPingTimeout)
	defer cancel()
	return qgaCall(ctx, st.path(QGASocket), "guest-ping", nil, nil)
}

// consoleScan reads a serial log as it grows and looks for
// agent.ConsoleReadyMarker alone on a line.
type consoleScan struct {
	path    string
	off     int64
	partial []byte
}

func newConsoleScan(path string) *consoleScan { return &consoleScan{path: path} }

// maxConsoleLine bounds the partial line kept between reads.
const maxConsoleLine = 4096

func (c *consoleScan) probe(context.Context) (string, error) {
	f, err := os.Open(c.path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() < c.off {
		c.off, c.partial = 0, nil // truncated: a new boot's log
	}
	data, err := io.ReadAll(io.NewSectionReader(f, c.off, 1<<20))
	if err != nil {
		return "", err
	}
	c.off += int64(len(data))
	buf := append(c.partial, data...)
	for {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			break
		}
		if string(bytes.TrimSpace(buf[:i])) == agent.ConsoleReadyMarker {
			return "", nil
		}
		buf = buf[i+1:]
	}
	if len(buf) > maxConsoleLine {
		buf = buf[len(buf)-maxConsoleLine:]
	}
	c.partial = append([]byte(nil), buf...)
	return "", fmt.Errorf("no %s line yet", agent.ConsoleReadyMarker)
}

// writeReadyFile records the first answer of the boot of QEMU pid as
// "<pid> <via> <unix nanoseconds> <addr>".
func writeReadyFile(path string, pid int, r agent.Readiness) error {
	tmp := path + ".partial"
	line := fmt.Sprintf("%d %s %d %s\n", pid, r.Via, r.At.UnixNano(), r.Addr)
	if err := os.WriteFile(tmp, []byte(line), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// readReadyFile reads a ReadyFile; ok only when it records an answer of the
// boot of QEMU pid.
func readReadyFile(path string, pid int) (agent.Readiness, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return agent.Readiness{}, false
	}
	f := strings.Fields(string(b))
	if len(f) < 3 || f[0] != strconv.Itoa(pid) {
		return agent.Readiness{}, false
	}
	ns, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		return agent.Readiness{}, false
	}
	r := agent.Readiness{Ready: true, Via: f[1], At: time.Unix(0, ns)}
	if len(f) > 3 {
		r.Addr = f[3]
	}
	return r, true
}
