// Package demo is `gitfleet demo`: on one machine, without internet, it
// builds (or reuses) the tiny guest, creates a bare repository holding a
// small fleet — one Host, two VMs, one Volume — and runs the controller and
// an agent with the QEMU backend in this process against that repository's
// file:// URL. It prints what the controller did (from its ledger, each
// line before the agent's lines it caused), each VM's phase as it changes,
// the tiny guest's console lines, a summary once every running guest has
// booted, and how to change the fleet with git; it then keeps applying
// pushes until its context ends.
//
// Everything lives under one directory (Layout), so re-running resumes
// where the last run stopped — pushes, disks and volumes are kept — and
// removing the directory removes everything. On exit the demo shuts its
// guests down (their disks stay) unless Config.Keep is set, in which case
// they keep running and the next run re-attaches them.
//
// It owns no branch file: it pushes object files to the desired branch as
// a person would, and reads ledger.yaml through package snapshots.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/qemu"
	"github.com/gitfleet/gitfleet/cmd/gitfleet/internal/config"
	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/internal/redact"
	"github.com/gitfleet/gitfleet/status"
)

// Defaults of Config: short intervals, so a push lands within seconds.
const (
	DefaultTickInterval       = 3 * time.Second
	DefaultPollInterval       = 5 * time.Second
	DefaultControllerInterval = 5 * time.Second
	DefaultHeartbeat          = 15 * time.Second
	// DefaultTombstoneGrace is the demo agent's grace between a VM's or
	// volume's file being deleted and its disk being destroyed (5 min in a
	// real fleet).
	DefaultTombstoneGrace = time.Minute
)

// ErrBusy is returned when another demo runs on the same directory.
var ErrBusy = errors.New("another gitfleet demo runs on this directory")

// Layout is where the demo keeps everything, under Dir.
type Layout struct{ Dir string }

// Repo is the bare repository holding the fleet (fleet.git).
func (l Layout) Repo() string { return filepath.Join(l.Dir, "fleet.git") }

// Images holds the kernel and initramfs the fleet's file:// URLs name.
func (l Layout) Images() string { return filepath.Join(l.Dir, "images") }

// ControllerCache is the controller's clone of the repository.
func (l Layout) ControllerCache() string { return filepath.Join(l.Dir, "controller", "git") }

// AgentCache is the agent's clone of the repository.
func (l Layout) AgentCache() string { return filepath.Join(l.Dir, "agent", "git") }

// State is the agent's state store: VMs' directories (disks, serial logs)
// under vms/, volumes under volumes/.
func (l Layout) State() string { return filepath.Join(l.Dir, "agent", "state") }

// VMs holds the VMs' directories in the agent's state store (agent.Store's
// vms/).
func (l Layout) VMs() string { return filepath.Join(l.State(), "vms") }

// SerialLog is the serial console log QEMU writes for the VM name.
func (l Layout) SerialLog(name string) string {
	return filepath.Join(l.VMs(), name, qemu.SerialLog)
}

// Volume is the file of the volume name (agent.Store's volumes/NAME).
func (l Layout) Volume(name string) string { return filepath.Join(l.State(), "volumes", name) }

// ImageCache is the QEMU backend's artifact cache (by sha256).
func (l Layout) ImageCache() string { return filepath.Join(l.Dir, "agent", "cache") }

// Log is the controller's and agent's log file.
func (l Layout) Log() string { return filepath.Join(l.Dir, "demo.log") }

// DefaultDir is the demo's directory when none is given:
// $XDG_STATE_HOME/gitfleet/demo, or ~/.local/state/gitfleet/demo.
func DefaultDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "gitfleet", "demo")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "gitfleet", "demo")
	}
	return filepath.Join(os.TempDir(), "gitfleet-demo")
}

// Config configures Run. Zero values take the defaults noted.
type Config struct {
	// Dir holds everything the demo makes (default DefaultDir()).
	Dir string
	// CacheDir is where the tiny guest is built and cached (default
	// DefaultCacheDir()).
	CacheDir string
	// Keep leaves the guests running when Run returns.
	Keep bool
	// Accel is the QEMU accelerator: auto (default), kvm or tcg.
	Accel string
	// Out receives the demo's progress and summary (default os.Stdout).
	Out io.Writer
	// Command is how the printed instructions call gitfleet (default
	// "gitfleet").
	Command string
	// Version is the agent version reported in status.
	Version string
	// TickInterval, PollInterval and Heartbeat configure the agent;
	// ControllerInterval the controller's polling; TombstoneGrace the
	// agent's grace before a deleted VM or volume is destroyed. See the
	// Default* constants.
	TickInterval       time.Duration
	PollInterval       time.Duration
	Heartbeat          time.Duration
	ControllerInterval time.Duration
	TombstoneGrace     time.Duration
	// OnSettled, if set, is called once, after the summary is printed, the
	// first time every VM is ready or stopped. Tests use it to end the run.
	OnSettled func(*status.Status)
}

func (c *Config) defaults() error {
	if c.Dir == "" {
		c.Dir = DefaultDir()
	}
	abs, err := filepath.Abs(c.Dir)
	if err != nil {
		return fmt.Errorf("demo directory %s: %w", c.Dir, err)
	}
	c.Dir = abs
	if c.CacheDir == "" {
		c.CacheDir = DefaultCacheDir()
	}
	if c.Accel == "" {
		c.Accel = qemu.AccelAuto
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
	if c.Command == "" {
		c.Command = "gitfleet"
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	if c.TickInterval <= 0 {
		c.TickInterval = DefaultTickInterval
	}
	if c.PollInterval <= 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.ControllerInterval <= 0 {
		c.ControllerInterval = DefaultControllerInterval
	}
	if c.TombstoneGrace <= 0 {
		c.TombstoneGrace = DefaultTombstoneGrace
	}
	return nil
}

// Run runs the demo until ctx ends (Ctrl-C), then stops the controller and
// the agent, shuts the guests down unless cfg.Keep, and says what stays
// where. It returns an error wrapping ErrMissingTools when QEMU is not
// installed, ErrBusy when another demo holds the directory, or a failure to
// build the guest or set up the repository; once the fleet runs, failures
// of a VM are shown, not returned.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	if err := CheckTools(); err != nil {
		return err
	}
	l := Layout{Dir: cfg.Dir}
	if err := os.MkdirAll(l.Dir, 0o755); err != nil {
		return fmt.Errorf("demo directory: %w", err)
	}
	unlock, err := lockDir(l.Dir)
	if err != nil {
		return err
	}
	defer unlock()
	out := cfg.Out
	start := time.Now()
	fmt.Fprintf(out, "gitfleet demo in %s\n", l.Dir)

	fmt.Fprintf(out, "  tiny guest: building or reusing it in %s ...\n", cfg.CacheDir)
	g, err := PrepareGuest(ctx, cfg.CacheDir, l.Images())
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  tiny guest: %s and %s (%.1fs)\n", filepath.Base(g.Kernel), filepath.Base(g.Initrd), time.Since(start).Seconds())

	logFile, err := os.OpenFile(l.Log(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("demo log: %w", err)
	}
	defer logFile.Close()
	logger := redact.Logger(logrus.New())
	logger.SetOutput(logFile)
	logger.SetLevel(logrus.InfoLevel)

	url, lw, err := openRepo(ctx, out, l, g, logrus.NewEntry(logger))
	if err != nil {
		return err
	}
	rt, err := startFleet(ctx, cfg, l, url, logger)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  controller and agent: running, accelerator %s (logs: %s)\n", rt.prov.Accel(), l.Log())
	if rt.prov.Accel() == qemu.AccelTCG {
		fmt.Fprintln(out, "  (no usable KVM here: the guests run under QEMU's TCG emulation, slower but fine for the demo)")
	}
	fmt.Fprintln(out)
	watch(ctx, cfg, l, url, start, rt, lw)
	return stopFleet(cfg, l, rt)
}

// openRepo sets the demo's repository up (or resumes it) and says which,
// and starts watching the controller's ledger on it.
func openRepo(ctx context.Context, out io.Writer, l Layout, g Guest, log *logrus.Entry) (string, *ledgerWatch, error) {
	url, created, err := SetupRepo(ctx, l.Repo(), FleetFiles(g), log)
	if err != nil {
		return "", nil, err
	}
	if created {
		fmt.Fprintf(out, "  repository: %s, with the demo fleet committed to %s\n", url, MainBranch)
	} else {
		fmt.Fprintf(out, "  repository: %s (resumed: its %s branch is kept as it is)\n", url, MainBranch)
	}
	lrepo, err := gitsource.Open(ctx, gitsource.Options{URL: url, Logger: log})
	if err != nil {
		return "", nil, err
	}
	lw := &ledgerWatch{repo: lrepo}
	if msg := lw.baseline(ctx); msg != "" {
		fmt.Fprintf(out, "  %s\n", msg)
	}
	return url, lw, nil
}

// watch prints what the controller and the agent do, and the summary the
// first time the fleet settles, until ctx ends or either stops early.
func watch(ctx context.Context, cfg Config, l Layout, url string, start time.Time, rt *stack, lw *ledgerWatch) {
	w := newWatcher(cfg.Out, start, l)
	w.attached = rt.attached
	settled := false
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-rt.failed:
			return
		case <-t.C:
		}
		st := rt.eng.Report()
		// The ledger is read every 2 s, and at once when the agent took a
		// snapshot newer than the ledger told of: the controller's lines
		// then come before the agent's lines they caused.
		if n%4 == 0 || lw.due(HostName, st.LastSeenEpoch) {
			for _, msg := range lw.read(ctx) {
				w.line("%s", msg)
			}
		}
		w.observe(st)
		if !settled && w.settled(st) {
			settled = true
			fmt.Fprintf(cfg.Out, "\nThe fleet is up after %.1fs: %s.\n\n", w.upAfter(st, time.Now()).Seconds(), w.upSummary(st))
			printSummary(cfg.Out, cfg, l, url, st)
			if cfg.OnSettled != nil {
				cfg.OnSettled(st)
			}
		}
	}
}

// stopFleet stops the controller and the agent, shuts the guests down
// unless cfg.Keep, and says what stays where.
func stopFleet(cfg Config, l Layout, rt *stack) error {
	out := cfg.Out
	fmt.Fprintln(out, "\nStopping the controller and the agent ...")
	runErr := rt.stop()
	vms := l.VMs()
	if cfg.Keep {
		fmt.Fprintf(out, "The VMs keep running (--keep), their disks in %s; the next `%s demo --dir %s` re-attaches them.\n",
			vms, cfg.Command, l.Dir)
		fmt.Fprintf(out, "To remove everything: run that without --keep, stop it with Ctrl-C, then rm -rf %s\n", l.Dir)
	} else {
		shutdownAll(out, rt)
		fmt.Fprintf(out, "The VMs are shut down. Their disks stay in %s; the next `%s demo --dir %s` boots them again.\n",
			vms, cfg.Command, l.Dir)
		fmt.Fprintf(out, "To remove everything: rm -rf %s\n", l.Dir)
	}
	return runErr
}

// stack is the running controller and agent.
type stack struct {
	prov   demoProvisioner
	eng    *agent.Engine
	store  *agent.Store
	cancel context.CancelFunc
	wg     sync.WaitGroup
	errMu  sync.Mutex
	err    error
	failed chan struct{} // closed when the controller or agent returned early
	once   sync.Once
	// attached are the VMs whose QEMU was already running when the demo
	// started (a run with Keep left them): their serial logs hold an old
	// boot.
	attached map[string]bool
}

// startFleet opens the repository twice (a full clone for the controller, a
// shallow one for the agent, as on separate machines) and starts the
// controller's and the agent's loops, each wired by package config like
// gitfleet controller and gitfleet agent, from the demo's settings.
func startFleet(ctx context.Context, cfg Config, l Layout, url string, logger *logrus.Logger) (*stack, error) {
	cc := controllerConfig(l, url)
	fc, err := cc.Fleet(logrus.NewEntry(logger))
	if err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	ctrl, err := fleet.New(fc)
	if err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	ac := agentConfig(cfg, l, url)
	parts, err := ac.Open(ctx, logger)
	if err != nil {
		ctrl.Close()
		return nil, fmt.Errorf("agent: %w", err)
	}
	prov, ok := parts.Provisioner.(demoProvisioner)
	if !ok {
		ctrl.Close()
		return nil, fmt.Errorf("agent: backend %s reports no accelerator", ac.Backend)
	}
	ag, err := agent.New(parts.Config)
	if err != nil {
		ctrl.Close()
		parts.Engine.Close(context.Background())
		return nil, fmt.Errorf("agent: %w", err)
	}
	// Before the agent runs, a live QEMU can only be one a past run left.
	attached := map[string]bool{}
	if recs, _, err := parts.Store.LoadRecords(); err == nil {
		for name := range recs {
			if prov.Running(name) {
				attached[name] = true
			}
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	rt := &stack{prov: prov, eng: parts.Engine, store: parts.Store, cancel: cancel, failed: make(chan struct{}), attached: attached}
	rt.goRun("controller", func() error {
		defer ctrl.Close() // its cache is the next run's
		return ctrl.Run(rctx, cfg.ControllerInterval)
	})
	rt.goRun("agent", func() error { return ag.Run(rctx) })
	return rt, nil
}

// demoProvisioner is what the demo asks of the agent's backend: the QEMU
// one's accelerator, besides the Provisioner contract.
type demoProvisioner interface {
	agent.Provisioner
	agent.AccelReporter
}

// controllerConfig is the controller's configuration in the demo: the
// defaults, on the demo's repository, with its clone in the layout.
func controllerConfig(l Layout, url string) config.Controller {
	c := config.DefaultController()
	c.Repo.URL = url
	c.CacheDir = l.ControllerCache()
	return c
}

// agentConfig is the agent's configuration in the demo: the defaults, with
// no systemd scope (the guests are the demo's), file:// artifacts from the
// layout's images only, the demo's short intervals and grace, and boot and
// shutdown bounds for a tiny guest under TCG.
func agentConfig(cfg Config, l Layout, url string) config.Agent {
	c := config.DefaultAgent()
	c.RepoURL, c.Host, c.Version = url, HostName, cfg.Version
	c.StateDir, c.GitCacheDir, c.ImageCacheDir = l.State(), l.AgentCache(), l.ImageCache()
	c.QEMU.Accel, c.QEMU.SystemdScope = cfg.Accel, false
	c.QEMU.BootTimeout, c.QEMU.PowerdownTimeout = 60*time.Second, 20*time.Second
	c.Artifacts = qemu.ArtifactPolicy{FileRoots: []string{l.Images()}}
	c.TickInterval, c.PollInterval, c.Heartbeat = cfg.TickInterval, cfg.PollInterval, cfg.Heartbeat
	c.TombstoneGrace, c.StopTimeout = cfg.TombstoneGrace, 30*time.Second
	return c
}

// goRun runs fn; an error other than the context's is kept for stop and
// ends the demo.
func (rt *stack) goRun(name string, fn func() error) {
	rt.wg.Add(1)
	go func() {
		defer rt.wg.Done()
		err := fn()
		if err != nil && !errors.Is(err, context.Canceled) {
			rt.errMu.Lock()
			rt.err = errors.Join(rt.err, fmt.Errorf("%s: %w", name, err))
			rt.errMu.Unlock()
			rt.once.Do(func() { close(rt.failed) })
		}
	}()
}

// stop ends both loops and waits for them (the agent finishes the passes in
// flight and writes its status once more).
func (rt *stack) stop() error {
	rt.cancel()
	rt.wg.Wait()
	rt.errMu.Lock()
	defer rt.errMu.Unlock()
	return rt.err
}

// shutdownAll shuts every VM the agent has a record of down gracefully.
func shutdownAll(out io.Writer, rt *stack) {
	recs, _, err := rt.store.LoadRecords()
	if err != nil {
		fmt.Fprintf(out, "cannot list the VMs to shut down: %v\n", err)
		return
	}
	names := make([]string, 0, len(recs))
	for name := range recs {
		names = append(names, name)
	}
	sort.Strings(names)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, name := range names {
		if !rt.prov.Running(name) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			err := rt.prov.Shutdown(ctx, name)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				fmt.Fprintf(out, "  %s: shutdown failed: %v\n", name, err)
			} else {
				fmt.Fprintf(out, "  %s: shut down\n", name)
			}
		}()
	}
	wg.Wait()
}

// bootWait bounds how long the summary waits for a booting VM's guest to
// answer (status ready) before it says the guest has not.
const bootWait = 2 * time.Minute

// progressEvery is the least time between two progress lines of one VM
// being created.
const progressEvery = 5 * time.Second

// rowFormat lays out a line about one VM: name, phase (wide enough for
// "quarantined"), power, detail. consoleFormat is a console line.
const (
	rowFormat     = "%-10s %-11s %-8s %s"
	consoleFormat = "%-10s %-11s %s"
)

// watcher prints one line per change of a VM's phase, power or error (and
// while a VM is created, its progress message every progressEvery), the
// tiny guest's console lines, and when a VM is quarantined, vanished,
// destroyed or gone.
type watcher struct {
	out         io.Writer
	start       time.Time
	layout      Layout
	seen        map[string]status.VM
	consoles    map[string]*console
	upAt        map[string]time.Time // when a VM's QEMU was last seen coming up
	readyAt     map[string]time.Time // when a VM was last seen becoming ready
	msgAt       map[string]time.Time // when a VM's line was last printed
	quarantined map[string]bool
	vanished    map[string]string // name → the state last printed
	destroyed   []string
	// attached are VMs whose QEMU ran before the demo started: their
	// console is followed from its end, not replayed.
	attached map[string]bool
}

func newWatcher(out io.Writer, start time.Time, l Layout) *watcher {
	return &watcher{out: out, start: start, layout: l, seen: map[string]status.VM{},
		consoles: map[string]*console{}, upAt: map[string]time.Time{}, readyAt: map[string]time.Time{}, msgAt: map[string]time.Time{},
		quarantined: map[string]bool{}, vanished: map[string]string{}, attached: map[string]bool{}}
}

// settled reports whether the host reports at least one VM, every VM is
// ready (its guest answered) or stopped with nothing quarantined; a VM
// still booting bootWait after its QEMU came up no longer holds it back.
func (w *watcher) settled(st *status.Status) bool {
	if len(st.VMs) == 0 || len(st.Quarantined) > 0 {
		return false
	}
	for _, vm := range st.VMs {
		switch vm.Phase {
		case status.PhaseStopped, status.PhaseReady:
		case status.PhaseBooting:
			if time.Since(w.upAt[vm.Name]) < bootWait {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// upAfter is how long after the demo's start a settled st was up: when
// the last of its ready guests answered (a destroy or a silent guest the
// settling waited for is no part of it), or now when none is ready.
func (w *watcher) upAfter(st *status.Status, now time.Time) time.Duration {
	var last time.Time
	for _, vm := range st.VMs {
		if at, ok := w.readyAt[vm.Name]; ok && vm.Phase == status.PhaseReady && at.After(last) {
			last = at
		}
	}
	if last.IsZero() {
		last = now
	}
	return last.Sub(w.start)
}

// upSummary says what "up" means for a settled st: how many guests have
// answered, which run QEMU without their guest answering, how many are
// stopped.
func (w *watcher) upSummary(st *status.Status) string {
	var ready, stopped int
	var silent []string
	for _, vm := range st.VMs {
		switch vm.Phase {
		case status.PhaseStopped:
			stopped++
		case status.PhaseReady:
			ready++
		default:
			silent = append(silent, vm.Name)
		}
	}
	var parts []string
	if ready > 0 {
		parts = append(parts, plural(ready, "guest")+" ready")
	}
	if len(silent) > 0 {
		parts = append(parts, fmt.Sprintf("QEMU runs %s but the guest has not answered within %s", strings.Join(silent, ", "), bootWait))
	}
	if stopped > 0 {
		parts = append(parts, plural(stopped, "VM")+" stopped")
	}
	return strings.Join(parts, ", ")
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func (w *watcher) observe(st *status.Status) {
	now := map[string]bool{}
	for _, vm := range st.VMs {
		now[vm.Name] = true
		old, ok := w.seen[vm.Name]
		switch {
		case !ok || old.Phase != vm.Phase || old.Power != vm.Power || old.LastError != vm.LastError:
			w.seen[vm.Name] = vm
			w.msgAt[vm.Name] = time.Now()
			w.phaseChanged(vm, old)
		case vm.Phase == status.PhaseCreating && vm.Message != old.Message && time.Since(w.msgAt[vm.Name]) >= progressEvery:
			// A long create step (an image download) says how far it got.
			w.seen[vm.Name] = vm
			w.msgAt[vm.Name] = time.Now()
			w.line(rowFormat, vm.Name, vm.Phase, "", vm.Message)
		}
		if c := w.consoles[vm.Name]; c != nil {
			for _, msg := range c.read() {
				if msg == "ready" {
					msg = fmt.Sprintf("ready: the guest has booted, %.1fs after QEMU started", time.Since(w.upAt[vm.Name]).Seconds())
				}
				w.line(consoleFormat, vm.Name, "console", msg)
			}
		}
	}
	for _, q := range st.Quarantined {
		now[q.Name] = true
		if !w.quarantined[q.Name] {
			w.quarantined[q.Name] = true
			delete(w.seen, q.Name)
			w.line(rowFormat, q.Name, status.PhaseQuarantined, "stopped", "no longer in the desired state (its file deleted, or the VM renamed): shut down, destroyed after the grace")
		}
	}
	for name := range w.quarantined {
		if !now[name] {
			delete(w.quarantined, name)
		}
	}
	for _, v := range st.Vanished {
		now[v.Name] = true
		power, detail := v.Power, v.Reason
		if v.Quarantined {
			power = "stopped"
		}
		if v.LastError != "" {
			detail = "error: " + v.LastError
		}
		if state := power + "\x00" + detail; w.vanished[v.Name] != state {
			w.vanished[v.Name] = state
			delete(w.seen, v.Name)
			w.line(rowFormat, v.Name, "vanished", power, detail)
		}
	}
	for name := range w.vanished {
		if !now[name] {
			delete(w.vanished, name)
		}
	}
	for name := range w.seen {
		if !now[name] {
			delete(w.seen, name)
			delete(w.consoles, name)
			w.line("%-10s %s", name, "gone from this host's status")
		}
	}
	for _, name := range st.Destroyed {
		if !contains(w.destroyed, name) {
			w.destroyed = append(w.destroyed, name)
			w.line("%-10s %s", name, "destroyed: its disks are removed; volumes stay until their own file is deleted")
		}
	}
}

// up reports whether a phase means the VM's QEMU runs.
func up(phase string) bool { return phase == status.PhaseBooting || phase == status.PhaseReady }

// phaseChanged prints vm's new phase and follows its console while it
// runs. Booting means QEMU runs and the guest has not answered yet; ready
// means it has (docs/DESIGN.md, Readiness).
func (w *watcher) phaseChanged(vm, old status.VM) {
	cameUp := up(vm.Phase) && !up(old.Phase)
	attached := cameUp && old.Phase == "" && w.attached[vm.Name]
	if vm.Phase == status.PhaseReady && old.Phase != status.PhaseReady {
		w.readyAt[vm.Name] = time.Now()
	}
	var notes []string
	switch {
	case vm.LastError != "":
		notes = append(notes, "error: "+vm.LastError)
	case attached:
		notes = append(notes, "QEMU was already running: re-attached")
	case vm.Phase == status.PhaseBooting:
		notes = append(notes, "QEMU up, the guest boots")
	case vm.Phase == status.PhaseReady && old.Phase == status.PhaseBooting:
		notes = append(notes, fmt.Sprintf("the guest answered, %.1fs after QEMU came up", time.Since(w.upAt[vm.Name]).Seconds()))
	case vm.Message != "":
		notes = append(notes, vm.Message)
	}
	if up(vm.Phase) && vm.SSH != "" {
		notes = append(notes, "ssh forward "+vm.SSH)
	}
	power := vm.Power
	if vm.Phase == status.PhasePending || vm.Phase == status.PhaseCreating {
		power = "" // what it will be is the spec's; what it is says nothing yet
	}
	w.line(rowFormat, vm.Name, vm.Phase, power, strings.Join(notes, "; "))
	if cameUp {
		w.upAt[vm.Name] = time.Now()
		c := w.consoles[vm.Name]
		// Booted again, the guest's lines follow the last boot's in the
		// same log: the console reads on from where it was.
		if c == nil {
			c = &console{path: w.layout.SerialLog(vm.Name)}
			c.fromLastBoot() // this run's boot, not an earlier run's
			w.consoles[vm.Name] = c
		}
		if attached {
			// Its log holds a boot of an earlier run: print only what
			// comes next.
			c.skip()
		}
		delete(w.attached, vm.Name)
	}
}

func (w *watcher) line(format string, args ...any) {
	fmt.Fprintf(w.out, "[%6.1fs] %s\n", time.Since(w.start).Seconds(), strings.TrimRight(fmt.Sprintf(format, args...), " "))
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// printSummary prints the fleet's VMs and volumes and how to change them.
// PHASE is the status's: ready only once the guest answered.
func printSummary(out io.Writer, cfg Config, l Layout, url string, st *status.Status) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VM\tPHASE\tPOWER\tSSH FORWARD\tSERIAL LOG")
	for _, vm := range st.VMs {
		ssh := "-"
		if up(vm.Phase) && vm.SSH != "" {
			ssh = vm.SSH
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", vm.Name, vm.Phase, vm.Power, ssh,
			l.SerialLog(vm.Name))
	}
	tw.Flush()
	for _, v := range st.Volumes {
		state := "present"
		if !v.Present {
			state = "absent"
		}
		fmt.Fprintf(out, "Volume %s: %s, %d GB, %s\n", v.Name, state, v.SizeGB, l.Volume(v.Name))
	}
	fmt.Fprintf(out, `(The tiny guest runs no SSH server: its serial log shows what it saw. With a
cloud image, "ssh -p PORT user@127.0.0.1" reaches the guest through the forward.)

Change the fleet with git, from another terminal:
  git clone %[1]s demo-fleet && cd demo-fleet
  sed 's/%[4]s/%[4]s-b/g' vms/%[4]s.yaml > vms/%[4]s-b.yaml    # add a VM
  sed -i 's/power: running/power: stopped/' vms/%[4]s.yaml       # stop %[4]s
  git add -A && git commit -m "change the demo fleet" && git push
  # watch it land: this terminal prints each change; the live state is on
  # the gitfleet/status branch, README.md there is the controller's summary:
  %[2]s status --repo %[1]s
  git fetch origin gitfleet/status && git show FETCH_HEAD:README.md

Deleting a VM's file quarantines it; its disk is destroyed %[3]s later.
This demo applies pushes until Ctrl-C. Then it shuts the VMs down (their
disks stay; the next run boots them again), or leaves them running with --keep.

`, url, cfg.Command, cfg.TombstoneGrace, hintVM(st))
}

// hintVM is the VM the printed hints edit: the last running one of st
// (the fleet as it is now: a VM renamed or deleted since is not named),
// else its last one, else the demo's own hello-2.
func hintVM(st *status.Status) string {
	name := "hello-2"
	for i, vm := range st.VMs {
		if i == 0 || vm.Power == "running" {
			name = vm.Name
		}
	}
	return name
}

// lockDir takes an exclusive, non-blocking flock on dir/.lock.
func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock demo directory: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrBusy, dir)
		}
		return nil, fmt.Errorf("lock demo directory: %w", err)
	}
	return func() { f.Close() }, nil
}
