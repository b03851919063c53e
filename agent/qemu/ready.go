package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"go.yaml.in/yaml/v3"

	"github.com/gitfleet/gitfleet/agent"
)

// Timings of the readiness probes. Each way (SSH, guest agent, console) is
// probed on its own goroutine, one probe at a time, ProbeInterval after
// the last one ended; every probe is bounded. A guest ready by SSH has its
// banner read again SSHRecheckInterval after the last read for
// sshRecheckEarly after it first answered (when cloud-init's later stages
// may restart sshd), SSHRecheckLate after the last read from then on: each
// read costs the guest one sshd process, so a settled guest is left in
// peace.
const (
	ProbeInterval      = 200 * time.Millisecond
	SSHRecheckInterval = 2 * time.Second
	SSHRecheckLate     = time.Minute
	sshRecheckEarly    = 10 * time.Minute
	sshDialTimeout     = time.Second
	sshBannerTimeout   = 5 * time.Second // sshd re-execs per connection: slow under TCG
	qgaPingTimeout     = 2 * time.Second
)

// bootWatch probes one boot of a VM (one QEMU process, by pid). For a
// guest whose seed gives SSH keys (Readiness.SSHRequired) only its SSH
// banner counts, and readiness follows it: a refusal after an answer
// makes the guest not ready until it answers again. Any other guest is
// ready from the first answer of any way until the process is gone. A
// guest reset (QEMU's RESET event, events.go) ends the watch: the next
// boot in the same process has its own, and is not ready until it
// answers. The
// current answer is kept in memory and in ReadyFile, so an agent
// restarted during the same boot reads the guest as ready at once (and,
// for SSHRequired, reads its banner again at once).
type bootWatch struct {
	pid int
	// cancel ends the watch (its probes, the serial log's rotation, the
	// event reader); probed ends its probes only, once one answered.
	cancel, probed context.CancelFunc
	// recheck and recheckLate are the SSH recheck paces
	// (SSHRecheckInterval, SSHRecheckLate unless a test sets them).
	recheck, recheckLate time.Duration

	mu sync.Mutex
	r  agent.Readiness
	// reset is set once the guest reset (guestReset): the boot this
	// watch probed is over, and no answer is recorded for it any more.
	reset bool
}

func (w *bootWatch) readiness() agent.Readiness {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.r
}

// Readiness implements agent.Provisioner: what the probes of the VM's
// current boot found. It starts the probes when none run for the live
// QEMU (after an agent restart), and reads files only (the pidfile, /proc,
// the seed and ReadyFile), never the guest.
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
	log := p.log.WithField("vm", st.name)
	w := &bootWatch{pid: pid, recheck: SSHRecheckInterval, recheckLate: SSHRecheckLate}
	w.r.Booted = bootTime(st)
	if st.resetPid == pid && st.resetAt.After(w.r.Booted) {
		w.r.Booted = st.resetAt // this boot began with the guest's reset
	}
	sshRequired, err := seedGivesSSHKeys(st.path(SeedFile))
	if err != nil {
		log.WithError(err).Warn("seed unreadable: any way the guest answers counts")
	}
	w.r.SSHRequired = sshRequired
	w.r = restoreReadiness(st.path(ReadyFile), pid, w.r)
	ctx, cancel := context.WithCancel(context.Background())
	probes, probed := context.WithCancel(ctx)
	w.cancel, w.probed = cancel, probed
	st.watch = w
	go p.rotateLoop(ctx, st)
	go eventLoop(ctx, st.path(QMPEventsSocket), log, func(at time.Time, reason string) { p.guestReset(st, w, at, reason) })
	ctx = probes
	switch {
	case sshRequired:
		ssh := func(ctx context.Context) (string, error) { return p.probeSSH(ctx, st) }
		go w.sshLoop(ctx, ssh, st.path(ReadyFile), log)
	case !w.r.Ready:
		for via, probe := range map[string]func(context.Context) (string, error){
			agent.ReadySSH:        func(ctx context.Context) (string, error) { return p.probeSSH(ctx, st) },
			agent.ReadyGuestAgent: func(ctx context.Context) (string, error) { return "", p.probeQGA(ctx, st) },
			agent.ReadyConsole:    newConsoleScan(st.path(SerialLog)).probe,
		} {
			go w.probeLoop(ctx, via, probe, st.path(ReadyFile), log)
		}
	}
	return w
}

// guestReset ends w, the watch of a boot whose guest QEMU reset at at
// (reason: the QMP event), and starts watching the new boot in the same
// process: the VM is not ready until that boot answers. ReadyFile is
// removed and a BootMarker line appended to the serial log, so an agent
// restarted meanwhile, and the console probe, look only at the new boot.
func (p *Provisioner) guestReset(st *vmState, w *bootWatch, at time.Time, reason string) {
	st.watchMu.Lock()
	if st.watch != w {
		st.watchMu.Unlock()
		return
	}
	w.cancel()
	st.watch, st.resetPid, st.resetAt = nil, w.pid, at
	st.watchMu.Unlock()
	w.mu.Lock()
	w.reset = true // a probe that ends now records nothing
	wasReady := w.r.Ready
	w.mu.Unlock()
	log := p.log.WithField("vm", st.name).WithField("event", reason)
	if err := removeVMFile(st.dir, ReadyFile); err != nil {
		log.WithError(err).Warn("drop the readiness of the boot before the reset")
	}
	if err := appendBootMarker(st.path(SerialLog), at, "guest reset"); err != nil {
		log.WithError(err).Warn("mark the new boot in the serial log")
	}
	if wasReady {
		log.Warn("guest reset: not ready until the new boot answers")
	} else {
		log.Info("guest reset")
	}
	if pid := st.pid(); pid == w.pid {
		p.watch(st, pid)
	}
}

// currentWatch is the VM's bootWatch, nil when none runs.
func (st *vmState) currentWatch() *bootWatch {
	st.watchMu.Lock()
	defer st.watchMu.Unlock()
	return st.watch
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

// bootTime is when the VM's QEMU started: the modification time of the
// agent's record of its pid, else of its pidfile, which QEMU writes at
// start and can rewrite later (Boot removes old ones of both first).
func bootTime(st *vmState) time.Time {
	for _, f := range []string{PidRecordFile, PidFile} {
		if fi, err := os.Lstat(st.path(f)); err == nil {
			return fi.ModTime()
		}
	}
	return time.Now()
}

// seedGivesSSHKeys reports whether the NoCloud seed at path gives the
// guest SSH keys (meta-data public-keys, from the spec's
// cloudInit.sshAuthorizedKeys): such a guest is meant to be reached by
// SSH, so only its SSH banner makes it ready.
func seedGivesSSHKeys(path string) (bool, error) {
	_, files, err := readSeedISO(path)
	if err != nil {
		return false, err
	}
	var md struct {
		PublicKeys []string `yaml:"public-keys"`
	}
	if err := yaml.Unmarshal(files["meta-data"], &md); err != nil {
		return false, fmt.Errorf("seed %s: meta-data: %w", path, err)
	}
	return len(md.PublicKeys) > 0, nil
}

// probeLoop runs probe every ProbeInterval until it succeeds, another way
// succeeds, or ctx ends; the first success makes the boot ready for good.
func (w *bootWatch) probeLoop(ctx context.Context, via string, probe func(context.Context) (string, error), readyFile string, log *logrus.Entry) {
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
			w.answered(via, addr, time.Now(), readyFile, log)
			w.probed()
			return
		}
		t.Reset(ProbeInterval)
	}
}

// sshLoop reads the guest's SSH banner with probe for as long as ctx
// lasts: every ProbeInterval until the guest first answers, then at the
// recheck pace (SSHRecheckInterval, later SSHRecheckLate), whether it is
// ready or not: every read costs the guest an sshd process, and sshd
// drops connections past its MaxStartups (unauthenticated ones, which
// pile up when a slow guest's sshd cannot send its banner before the
// probe gives up), so probing a loaded guest harder would make it refuse.
// A guest ready by SSH is not ready after two refusals in a row (the
// second read ProbeInterval after the first), so one connection dropped
// past MaxStartups is not taken for sshd gone.
func (w *bootWatch) sshLoop(ctx context.Context, probe func(context.Context) (string, error), readyFile string, log *logrus.Entry) {
	t := time.NewTimer(0)
	defer t.Stop()
	refusals := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		addr, err := probe(ctx)
		if ctx.Err() != nil {
			return
		}
		now := time.Now()
		switch {
		case err == nil:
			refusals = 0
			w.answered(agent.ReadySSH, addr, now, readyFile, log)
		case refused(err):
			if refusals++; refusals == 1 && w.readiness().Ready {
				t.Reset(ProbeInterval) // confirm before the guest counts as refusing
				continue
			}
			w.refused(now, err, readyFile, log)
		default:
			refusals = 0
		}
		t.Reset(w.nextSSHProbe(now))
	}
}

// nextSSHProbe is how long after a probe ended at now the next one starts.
func (w *bootWatch) nextSSHProbe(now time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.r.At.IsZero():
		return ProbeInterval
	case now.Sub(w.r.At) < sshRecheckEarly:
		return w.recheck
	default:
		return w.recheckLate
	}
}

// answered records an answer via via (at addr) at now: the boot's first
// answer sets At, Via and Addr; an answer after a refusal makes the guest
// ready again. Each change is written to readyFile and logged.
func (w *bootWatch) answered(via, addr string, now time.Time, readyFile string, log *logrus.Entry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.r.Ready || w.reset {
		return
	}
	again := !w.r.At.IsZero()
	if !again {
		w.r.At, w.r.Via, w.r.Addr = now, via, addr
	}
	w.r.Ready, w.r.Refused, w.r.HeldBy = true, time.Time{}, ""
	if err := writeReadyFile(readyFile, w.pid, w.r); err != nil {
		log.WithError(err).Warn("save readiness")
	}
	if again {
		log.WithFields(logrus.Fields{"via": via, "addr": addr}).Info("guest answers again")
		return
	}
	log.WithFields(logrus.Fields{"via": via, "addr": addr, "seconds": now.Sub(w.r.Booted).Seconds()}).Info("guest answered")
}

// refused records that the guest's sshd refused at now. A guest ready by
// SSH is no longer ready: ReadyFile records the refusal (or, when it
// cannot be written, is removed), so an agent restarted meanwhile shows
// neither ready nor a guest that never answered, but the refusal, for as
// long as no banner is read again.
func (w *bootWatch) refused(now time.Time, why error, readyFile string, log *logrus.Entry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.r.Ready || w.reset {
		return
	}
	w.r.Ready, w.r.Refused, w.r.HeldBy = false, now, heldBy(why)
	if err := writeReadyFile(readyFile, w.pid, w.r); err != nil {
		log.WithError(err).Warn("save the refusal")
		if err := os.Remove(readyFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.WithError(err).Warn("drop saved readiness")
		}
	}
	if w.r.HeldBy != "" {
		log.WithError(why).Warn("another machine answers at the guest's address; not ready until the guest answers again")
		return
	}
	log.WithError(why).Warn("guest's sshd refuses after it answered; not ready until it answers again")
}

// refused reports whether a failed SSH probe is a refusal: the connection
// was refused or reset, or closed without an SSH banner. A probe that
// timed out or was cancelled says nothing (a slow guest is not one that
// refuses).
func refused(err error) bool {
	var ne net.Error
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return false
	}
	return !errors.Is(err, errNoAddress)
}

// errNoAddress: the guest's SSH address is not known yet.
var errNoAddress = errors.New("no ssh address yet")

// probeSSH reads the SSH identification line from the guest's port 22 at
// the address Address reports (its forward on 127.0.0.1 under user-mode
// networking), or, on a network where no address is observed yet, at its
// static address. A forward accepts connections before the guest listens
// and then closes them, so only the "SSH-" line counts. On a host network
// the banner counts only when the host's neighbour table shows the VM's
// MAC at that address (heldByGuest): another machine that holds the
// address is not the guest answering.
func (p *Provisioner) probeSSH(ctx context.Context, st *vmState) (string, error) {
	addr := p.Address(st.name).SSH
	if addr == "" {
		addr = p.staticSSH(st)
	}
	if addr == "" {
		return "", errNoAddress
	}
	if err := sshBanner(ctx, addr); err != nil {
		return addr, err
	}
	return addr, p.heldByGuest(st, addr)
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
// agent.ConsoleReadyMarker alone on a line, from the current boot's
// BootMarker on: the log keeps earlier boots' output, whose marker says
// nothing of this boot.
type consoleScan struct {
	path    string
	off     int64
	partial []byte
	started bool // off was set past the last BootMarker
}

func newConsoleScan(path string) *consoleScan { return &consoleScan{path: path} }

// maxConsoleLine bounds the partial line kept between reads.
const maxConsoleLine = 4096

func (c *consoleScan) probe(context.Context) (string, error) {
	f, err := openRegular(c.path, os.O_RDONLY, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if !c.started {
		head, err := io.ReadAll(io.LimitReader(f, SerialLogMax*2))
		if err != nil {
			return "", err
		}
		c.off, c.started = lastBootOffset(head), true
	}
	if fi, err := f.Stat(); err == nil && fi.Size() < c.off {
		c.off, c.partial = 0, nil // rotated: what is left is this boot's
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

// writeReadyFile records what the boot of QEMU pid proved: one line
// "<pid> <via> <at, Unix ns> <addr or -> <refused, Unix ns or 0> <held by
// or ->". The boot answered at <at>; a refused time other than 0 says
// its sshd has refused since then and it is not ready; held by, when set,
// that the refusal was another machine answering there (Readiness.HeldBy).
func writeReadyFile(path string, pid int, r agent.Readiness) error {
	addr, refused, holder := r.Addr, int64(0), r.HeldBy
	if addr == "" {
		addr = "-"
	}
	if holder == "" || strings.ContainsAny(holder, " \n") {
		holder = "-"
	}
	if !r.Refused.IsZero() {
		refused = r.Refused.UnixNano()
	}
	line := fmt.Sprintf("%d %s %d %s %d %s\n", pid, r.Via, r.At.UnixNano(), addr, refused, holder)
	return writeAtomic(path, []byte(line), 0o644)
}

// readReadyFile reads a ReadyFile; ok only when it records the boot of
// QEMU pid (which answered; Ready unless it records a refusal since).
// Lines of three or four fields, written before refusals were recorded,
// read as ready.
func readReadyFile(path string, pid int) (agent.Readiness, bool) {
	b, err := readRegular(path, 256)
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
	if len(f) > 3 && f[3] != "-" {
		r.Addr = f[3]
	}
	if len(f) > 4 {
		refused, err := strconv.ParseInt(f[4], 10, 64)
		if err != nil {
			return agent.Readiness{}, false
		}
		if refused != 0 {
			r.Ready, r.Refused = false, time.Unix(0, refused)
			if len(f) > 5 && f[5] != "-" {
				r.HeldBy = f[5]
			}
		}
	}
	return r, true
}

// restoreReadiness is the readiness of the boot of QEMU pid as an agent
// (re)starting to watch it finds it: base (when the boot began, whether
// SSH is required) with what ReadyFile recorded of that boot — its answer,
// and a refusal since, so a restarted agent keeps showing why the guest
// is not ready.
func restoreReadiness(path string, pid int, base agent.Readiness) agent.Readiness {
	r, ok := readReadyFile(path, pid)
	if !ok {
		return base
	}
	r.Booted, r.SSHRequired = base.Booted, base.SSHRequired
	return r
}
