package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/backup"
)

// A disk snapshot of a running VM (docs/DESIGN.md, "Backups: the
// point-in-time view") is QEMU's copy-before-write filter over each disk
// with a snapshot-access node on it, exported read-only over NBD:
//
//	device ──▶ gf-cbw-N (copy-before-write) ──file──▶ the disk's node
//	                │ target
//	                ▼
//	           gf-fleece-N (file node: backup-fleece-N.raw, sparse)
//	gf-access-N (snapshot-access, file: gf-cbw-N) ◀── NBD export "<disk>"
//
// Every guest write to a region not yet copied first copies the old data
// to the fleece file; reads of gf-access-N give the disk as it was at the
// instant the device was switched to the filter. The filter runs with
// on-cbw-error=break-snapshot and a cbw-timeout: a fleece file that fails
// or stalls breaks the snapshot (the stream fails, the backup does not
// count), never the guest's write.

// Files a disk snapshot makes in a VM's directory; Destroy removes them
// too, and SweepSnapshots removes what a killed agent left.
const (
	// SnapshotMarker records that a snapshot was begun (and whether the
	// guest may be frozen or paused); it is written before anything
	// changes and removed last.
	SnapshotMarker = "backup-snapshot.json"
	// NBDSocket is QEMU's NBD server while a snapshot is held.
	NBDSocket = "backup-nbd.sock"
	// fleecePrefix starts each fleece file: backup-fleece-<N>.raw.
	fleecePrefix = "backup-fleece-"
)

// Node names of a snapshot's pieces, per disk index.
func fleeceNode(i int) string { return "gf-fleece-" + strconv.Itoa(i) }
func cbwNode(i int) string    { return "gf-cbw-" + strconv.Itoa(i) }
func accessNode(i int) string { return "gf-access-" + strconv.Itoa(i) }
func exportID(i int) string   { return "gf-export-" + strconv.Itoa(i) }
func fleeceFile(i int) string { return fleecePrefix + strconv.Itoa(i) + ".raw" }

// fleeceFileName matches the fleece files SweepSnapshots may remove.
var fleeceFileName = regexp.MustCompile(`^backup-fleece-[0-9]+\.raw$`)

// cbwTimeout bounds one copy-before-write operation: a fleece file slower
// than this breaks the snapshot instead of holding up the guest's write.
const cbwTimeout = 30

// Defaults of agent.SnapshotOptions, and the bound of the pause that
// switches several disks at one instant.
const (
	defaultFreezeTimeout = 10 * time.Second
	defaultFrozenMax     = 5 * time.Second
	instantTimeout       = 5 * time.Second
	releaseTimeout       = 30 * time.Second
)

// fleeceSlack is free space kept beyond the disks' virtual sizes.
const fleeceSlack = 64 << 20

// fleeceDisk is one disk of a held snapshot.
type fleeceDisk struct {
	index  int
	name   string // "root" or the volume's name
	device string // QEMU's BlockBackend ("root", "vol0")
	qdev   string // QOM path of the device, for qom-set
	node   string // the device's node before the snapshot
	size   int64
}

// heldSnapshot is a VM's snapshot while it is held.
type heldSnapshot struct {
	info    agent.DiskSnapshot
	disks   []fleeceDisk
	streams map[string]*diskStream
}

// snapshotMarker is SnapshotMarker's content.
type snapshotMarker struct {
	Started time.Time `json:"started"`
	Freeze  bool      `json:"freeze"`
	Pause   bool      `json:"pause"`
}

var _ agent.DiskSnapshotter = (*Provisioner)(nil)

// SnapshotDisks implements agent.DiskSnapshotter.
func (p *Provisioner) SnapshotDisks(ctx context.Context, name string, opts agent.SnapshotOptions) (agent.DiskSnapshot, error) {
	st := p.state(name, "")
	if st == nil || st.pid() == 0 {
		return agent.DiskSnapshot{}, fmt.Errorf("snapshot %s: %w", name, agent.ErrNotRunning)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	log := p.log.WithField("vm", name)
	if st.snap != nil {
		return agent.DiskSnapshot{}, fmt.Errorf("snapshot %s: %w", name, agent.ErrSnapshotBusy)
	}
	if err := p.sweep(ctx, st, log); err != nil {
		return agent.DiskSnapshot{}, fmt.Errorf("snapshot %s: sweep an earlier snapshot: %w", name, err)
	}
	disks, err := p.snapshotDisks(ctx, st)
	if err != nil {
		return agent.DiskSnapshot{}, fmt.Errorf("snapshot %s: %w", name, err)
	}
	if err := checkFleeceSpace(st.dir, disks); err != nil {
		return agent.DiskSnapshot{}, fmt.Errorf("snapshot %s: %w", name, err)
	}
	held := &heldSnapshot{disks: disks, streams: map[string]*diskStream{}}
	info, err := p.takeSnapshot(ctx, st, held, opts, log)
	if err != nil {
		if rerr := p.release(st, held, log); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return agent.DiskSnapshot{}, fmt.Errorf("snapshot %s: %w", name, err)
	}
	held.info = info
	st.snap = held
	log.WithFields(logrus.Fields{"disks": len(disks), "consistency": info.Consistency, "frozen": info.Frozen.Seconds()}).Info("disk snapshot taken")
	return info, nil
}

// takeSnapshot runs the steps of a snapshot in order; the caller releases
// on error.
func (p *Provisioner) takeSnapshot(ctx context.Context, st *vmState, held *heldSnapshot, opts agent.SnapshotOptions, log *logrus.Entry) (agent.DiskSnapshot, error) {
	sock := st.path(QMPSocket)
	m := snapshotMarker{Started: time.Now().UTC(), Freeze: opts.Freeze, Pause: len(held.disks) > 1}
	if err := writeVMFile(st.dir, SnapshotMarker, markerJSON(m), p.user); err != nil {
		return agent.DiskSnapshot{}, fmt.Errorf("write %s: %w", SnapshotMarker, err)
	}
	for _, d := range held.disks {
		if err := p.addFleece(ctx, st, d); err != nil {
			return agent.DiskSnapshot{}, err
		}
	}
	info := agent.DiskSnapshot{Consistency: backup.ConsistencyCrash}
	for _, d := range held.disks {
		info.Disks = append(info.Disks, agent.DiskInfo{Name: d.name, VirtualSize: d.size})
	}
	if err := p.frozenInstant(ctx, st, held.disks, opts, &info, log); err != nil {
		return info, err
	}
	for _, d := range held.disks {
		if _, err := qmpCommand(ctx, sock, "blockdev-add", map[string]any{
			"driver": "snapshot-access", "node-name": accessNode(d.index), "file": cbwNode(d.index)}); err != nil {
			return info, fmt.Errorf("disk %s: %w", d.name, err)
		}
	}
	if _, err := qmpCommand(ctx, sock, "nbd-server-start", map[string]any{
		"addr": map[string]any{"type": "unix", "data": map[string]any{"path": NBDSocket}}}); err != nil {
		return info, err
	}
	for _, d := range held.disks {
		if _, err := qmpCommand(ctx, sock, "block-export-add", map[string]any{
			"type": "nbd", "id": exportID(d.index), "node-name": accessNode(d.index), "name": d.name, "writable": false}); err != nil {
			return info, fmt.Errorf("disk %s: %w", d.name, err)
		}
	}
	return info, nil
}

// blockInfo is one entry of QMP query-block.
type blockInfo struct {
	Device   string `json:"device"`
	QDev     string `json:"qdev"`
	Inserted *struct {
		NodeName string `json:"node-name"`
		File     string `json:"file"`
		Drv      string `json:"drv"`
		RO       bool   `json:"ro"`
		Image    struct {
			VirtualSize int64 `json:"virtual-size"`
		} `json:"image"`
	} `json:"inserted"`
}

// volumeDevice is the BlockBackend name boot.go gives volumes: vol<N>.
var volumeDevice = regexp.MustCompile(`^vol[0-9]+$`)

// snapshotDisks lists the VM's writable disks from QEMU itself: root, then
// the volumes in order, each named as a backup names it.
func (p *Provisioner) snapshotDisks(ctx context.Context, st *vmState) ([]fleeceDisk, error) {
	ret, err := qmpCommand(ctx, st.path(QMPSocket), "query-block", nil)
	if err != nil {
		return nil, err
	}
	var blocks []blockInfo
	if err := json.Unmarshal(ret, &blocks); err != nil {
		return nil, fmt.Errorf("query-block: %w", err)
	}
	var disks []fleeceDisk
	for _, b := range blocks {
		if b.Inserted == nil || b.Inserted.RO || (b.Device != "root" && !volumeDevice.MatchString(b.Device)) {
			continue
		}
		if strings.HasPrefix(b.Inserted.NodeName, "gf-") {
			return nil, fmt.Errorf("disk %s is still switched to %s", b.Device, b.Inserted.NodeName)
		}
		name := b.Device
		if name != "root" {
			name = filepath.Base(b.Inserted.File)
		}
		if err := backup.CheckName("disk", name); err != nil {
			return nil, err
		}
		if b.QDev == "" || b.Inserted.Image.VirtualSize <= 0 {
			return nil, fmt.Errorf("disk %s: query-block gives no device path or size", b.Device)
		}
		disks = append(disks, fleeceDisk{index: len(disks), name: name, device: b.Device, qdev: b.QDev,
			node: b.Inserted.NodeName, size: b.Inserted.Image.VirtualSize})
	}
	if len(disks) == 0 || disks[0].device != "root" {
		return nil, errors.New("query-block lists no root disk")
	}
	return disks, nil
}

// checkFleeceSpace refuses a snapshot whose fleece files could outgrow
// the free space of dir: each may grow to its disk's virtual size.
func checkFleeceSpace(dir string, disks []fleeceDisk) error {
	var need int64 = fleeceSlack
	for _, d := range disks {
		need += d.size
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		return fmt.Errorf("free space of %s: %w", dir, err)
	}
	free := int64(fs.Bavail) * fs.Bsize
	if free < need {
		return fmt.Errorf("%w: the view of %d disks may need up to %d bytes in %s (their virtual size), %d are free", agent.ErrNoFleeceSpace, len(disks), need, dir, free)
	}
	return nil
}

// addFleece makes disk d's fleece file (sparse, d.size bytes, QEMU's
// user's), hands QEMU its descriptor (QEMU's user cannot open a path
// under the state directory), and adds its file and copy-before-write
// nodes.
func (p *Provisioner) addFleece(ctx context.Context, st *vmState, d fleeceDisk) error {
	f, err := createVMFile(st.dir, fleeceFile(d.index), p.user)
	if err != nil {
		return fmt.Errorf("disk %s: fleece file: %w", d.name, err)
	}
	defer f.Close()
	if err := f.Truncate(d.size); err != nil {
		return fmt.Errorf("disk %s: fleece file: %w", d.name, err)
	}
	sock := st.path(QMPSocket)
	if err := qmpWithFile(ctx, sock, f, map[string]any{
		"driver": "file", "node-name": fleeceNode(d.index), "discard": "unmap"}); err != nil {
		return fmt.Errorf("disk %s: %w", d.name, err)
	}
	if _, err := qmpCommand(ctx, sock, "blockdev-add", map[string]any{
		"driver": "copy-before-write", "node-name": cbwNode(d.index), "file": d.node, "target": fleeceNode(d.index),
		"on-cbw-error": "break-snapshot", "cbw-timeout": cbwTimeout}); err != nil {
		return fmt.Errorf("disk %s: %w", d.name, err)
	}
	return nil
}

// frozenInstant takes the instant, inside a guest-agent freeze when opts
// ask for one and the agent answers, and records in info what happened.
func (p *Provisioner) frozenInstant(ctx context.Context, st *vmState, disks []fleeceDisk, opts agent.SnapshotOptions, info *agent.DiskSnapshot, log *logrus.Entry) error {
	if !opts.Freeze {
		info.At = time.Now()
		return p.instant(ctx, st, disks)
	}
	fz := p.freezeGuest(ctx, st, opts, log)
	defer fz.thaw()
	if fz.err != nil {
		info.Reason = "no freeze: " + fz.err.Error()
	} else if opts.WhileFrozen != nil {
		if err := opts.WhileFrozen(fz.ctx); err != nil {
			return fmt.Errorf("while frozen: %w", err)
		}
	}
	info.At = time.Now()
	err := p.instant(ctx, st, disks)
	frozen, thawErr := fz.thaw()
	info.Frozen, info.Filesystems = frozen, fz.filesystems
	switch {
	case err != nil:
		return err
	case thawErr != nil:
		return fmt.Errorf("thaw the guest: %w", thawErr)
	case fz.err == nil && fz.expired():
		info.Reason = fmt.Sprintf("the freeze ended at its bound (%s) before the instant", fz.max)
	case fz.err == nil && fz.filesystems == 0:
		info.Reason = "the guest agent froze no filesystem"
	case fz.err == nil:
		info.Consistency = backup.ConsistencyApplication
	}
	return nil
}

// instant switches every disk's device to its copy-before-write filter.
// Several disks switch while the VM is paused (QMP stop drains and flushes
// all I/O first), so they share one instant; the VM is resumed on every
// path, bounded by instantTimeout. A disk already switched is switched
// back when a later one fails.
func (p *Provisioner) instant(ctx context.Context, st *vmState, disks []fleeceDisk) (err error) {
	sock := st.path(QMPSocket)
	ctx, cancel := context.WithTimeout(ctx, instantTimeout)
	defer cancel()
	if len(disks) > 1 {
		if _, err := qmpCommand(ctx, sock, "stop", nil); err != nil {
			return fmt.Errorf("pause for the instant: %w", err)
		}
		defer func() {
			rctx, rcancel := context.WithTimeout(context.Background(), instantTimeout)
			defer rcancel()
			if _, cerr := qmpCommand(rctx, sock, "cont", nil); cerr != nil {
				err = errors.Join(err, fmt.Errorf("resume after the instant: %w", cerr))
			}
		}()
	}
	for i, d := range disks {
		if _, err := qmpCommand(ctx, sock, "qom-set", map[string]any{"path": d.qdev, "property": "drive", "value": cbwNode(d.index)}); err != nil {
			for _, back := range disks[:i] {
				qmpCommand(context.Background(), sock, "qom-set", map[string]any{"path": back.qdev, "property": "drive", "value": back.node})
			}
			return fmt.Errorf("disk %s: switch to the snapshot filter: %w", d.name, err)
		}
	}
	return nil
}

// freeze is a guest-agent freeze in progress: thawed once, by whichever
// comes first of the caller and the FrozenMax timer.
type freeze struct {
	p           *Provisioner
	st          *vmState
	ctx         context.Context // ends when the freeze must end
	cancel      context.CancelFunc
	max         time.Duration
	err         error // the freeze failed (crash-consistent); thawed anyway
	filesystems int
	start       time.Time
	log         *logrus.Entry

	mu       sync.Mutex
	done     bool
	frozen   time.Duration
	thawErr  error
	timedOut bool
}

// freezeGuest asks the guest agent to freeze the guest's filesystems,
// bounded by opts.FreezeTimeout, and arms the FrozenMax timer. The
// channel is the VM's for the freeze's whole life: the readiness probe
// waits.
func (p *Provisioner) freezeGuest(ctx context.Context, st *vmState, opts agent.SnapshotOptions, log *logrus.Entry) *freeze {
	fz := &freeze{p: p, st: st, max: defaultFrozenMax, log: log}
	if opts.FrozenMax > 0 {
		fz.max = opts.FrozenMax
	}
	timeout := defaultFreezeTimeout
	if opts.FreezeTimeout > 0 {
		timeout = opts.FreezeTimeout
	}
	st.qgaMu.Lock()
	fz.start = time.Now()
	fctx, fcancel := context.WithTimeout(ctx, timeout)
	fz.err = qgaCall(fctx, st.path(QGASocket), "guest-fsfreeze-freeze", nil, &fz.filesystems)
	fcancel()
	fz.ctx, fz.cancel = context.WithTimeout(context.Background(), fz.max)
	go func() {
		<-fz.ctx.Done()
		if errors.Is(fz.ctx.Err(), context.DeadlineExceeded) {
			fz.mu.Lock()
			fz.timedOut = !fz.done
			fz.mu.Unlock()
			fz.thaw()
		}
	}()
	return fz
}

// thaw thaws the guest (also after a failed or timed-out freeze: the
// agent may have frozen without its answer arriving), at most once, and
// returns how long the guest was frozen. The thaw is bounded by its own
// few seconds, whatever the caller's context says, and retried within
// them.
func (fz *freeze) thaw() (time.Duration, error) {
	fz.mu.Lock()
	defer fz.mu.Unlock()
	if fz.done {
		return fz.frozen, fz.thawErr
	}
	fz.done = true
	defer fz.st.qgaMu.Unlock()
	defer fz.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), thawTimeout)
	defer cancel()
	for {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		fz.thawErr = qgaCall(cctx, fz.st.path(QGASocket), "guest-fsfreeze-thaw", nil, nil)
		ccancel()
		if fz.thawErr == nil || fz.err != nil || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	fz.frozen = time.Since(fz.start)
	if fz.err != nil {
		// No freeze took hold (no agent, or it refused): a failed thaw
		// is expected and says nothing.
		fz.frozen, fz.thawErr = 0, nil
	} else if fz.thawErr != nil {
		fz.log.WithError(fz.thawErr).Error("guest agent did not thaw the guest; the sweep tries again")
	}
	return fz.frozen, fz.thawErr
}

// thawTimeout bounds one thaw, retries included.
const thawTimeout = 5 * time.Second

// expired reports whether the FrozenMax timer thawed the guest before
// the caller did.
func (fz *freeze) expired() bool {
	fz.mu.Lock()
	defer fz.mu.Unlock()
	return fz.timedOut
}

// OpenSnapshotDisk implements agent.DiskSnapshotter.
func (p *Provisioner) OpenSnapshotDisk(ctx context.Context, name, disk string) (agent.DiskStream, error) {
	st := p.state(name, "")
	if st == nil {
		return nil, fmt.Errorf("snapshot %s: %w", name, agent.ErrNotRunning)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	held := st.snap
	if held == nil {
		return nil, fmt.Errorf("snapshot %s: none held", name)
	}
	for _, d := range held.disks {
		if d.name != disk {
			continue
		}
		if s := held.streams[disk]; s != nil && !s.isClosed() {
			return nil, fmt.Errorf("snapshot %s: disk %s is being read already", name, disk)
		}
		uid := os.Geteuid()
		if p.user != nil {
			uid = p.user.uid
		}
		sockFile, err := openVMSocket(st.dir, NBDSocket, uid)
		if err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", name, err)
		}
		s, err := nbdStream(ctx, "/proc/self/fd/3", []*os.File{sockFile}, d.name, d.size)
		sockFile.Close()
		if err != nil {
			return nil, fmt.Errorf("snapshot %s: disk %s: %w", name, disk, err)
		}
		held.streams[disk] = s
		return s, nil
	}
	return nil, fmt.Errorf("snapshot %s: %w %q", name, agent.ErrNoSuchDisk, disk)
}

// ReleaseSnapshot implements agent.DiskSnapshotter.
func (p *Provisioner) ReleaseSnapshot(ctx context.Context, name string) error {
	st := p.state(name, "")
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	held := st.snap
	if held == nil {
		return nil
	}
	st.snap = nil
	return p.release(st, held, p.log.WithField("vm", name))
}

// release gives back every piece of held in reverse order of making,
// each step tried whatever the one before did, bounded by
// releaseTimeout, then removes the fleece files and the marker.
func (p *Provisioner) release(st *vmState, held *heldSnapshot, log *logrus.Entry) error {
	for _, s := range held.streams {
		s.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	var errs []error
	if st.pid() != 0 {
		sock := st.path(QMPSocket)
		qmpCommand(ctx, sock, "nbd-server-stop", nil) // fails when it never started
		// The access nodes go first: while one is attached its filter
		// keeps the disk's node from taking the device's writes back.
		errs = append(errs, delNodes(ctx, sock, len(held.disks), accessNode))
		for _, d := range held.disks {
			errs = append(errs, unswitch(ctx, sock, d.qdev, cbwNode(d.index), d.node))
		}
		errs = append(errs, delNodes(ctx, sock, len(held.disks), cbwNode, fleeceNode))
	}
	errs = append(errs, removeFleeceFiles(st.dir))
	if err := errors.Join(errs...); err != nil {
		log.WithError(err).Warn("disk snapshot not fully released; the sweep tries again")
		return err
	}
	return removeVMFile(st.dir, SnapshotMarker)
}

// unswitch points the device at qdev back at node when it is on cbw.
func unswitch(ctx context.Context, sock, qdev, cbw, node string) error {
	blocks, err := queryBlock(ctx, sock)
	if err != nil {
		return err
	}
	for _, b := range blocks {
		if b.QDev == qdev && b.Inserted != nil && b.Inserted.NodeName == cbw {
			if _, err := qmpCommand(ctx, sock, "qom-set", map[string]any{"path": qdev, "property": "drive", "value": node}); err != nil {
				return fmt.Errorf("switch %s back to %s: %w", qdev, node, err)
			}
		}
	}
	return nil
}

func queryBlock(ctx context.Context, sock string) ([]blockInfo, error) {
	ret, err := qmpCommand(ctx, sock, "query-block", nil)
	if err != nil {
		return nil, err
	}
	var blocks []blockInfo
	if err := json.Unmarshal(ret, &blocks); err != nil {
		return nil, fmt.Errorf("query-block: %w", err)
	}
	return blocks, nil
}

// delNodes deletes the nodes of disks 0..n-1 named by kinds that exist,
// in the order of kinds (parents before their children).
func delNodes(ctx context.Context, sock string, n int, kinds ...func(int) string) error {
	have, err := namedNodes(ctx, sock)
	if err != nil {
		return err
	}
	var errs []error
	for _, node := range kinds {
		for i := 0; i < n; i++ {
			if !have[node(i)] {
				continue
			}
			var err error
			for try := 0; try < 10; try++ {
				if _, err = qmpCommand(ctx, sock, "blockdev-del", map[string]any{"node-name": node(i)}); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond) // an export closing its connections
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// namedNodes is the set of node names QEMU has.
func namedNodes(ctx context.Context, sock string) (map[string]bool, error) {
	ret, err := qmpCommand(ctx, sock, "query-named-block-nodes", map[string]any{"flat": true})
	if err != nil {
		return nil, err
	}
	var nodes []struct {
		NodeName string `json:"node-name"`
	}
	if err := json.Unmarshal(ret, &nodes); err != nil {
		return nil, fmt.Errorf("query-named-block-nodes: %w", err)
	}
	have := map[string]bool{}
	for _, n := range nodes {
		have[n.NodeName] = true
	}
	return have, nil
}

// removeFleeceFiles removes every fleece file of dir (unlinking a name
// never follows it).
func removeFleeceFiles(dir string) error {
	es, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range es {
		if fleeceFileName.MatchString(e.Name()) {
			errs = append(errs, removeVMFile(dir, e.Name()))
		}
	}
	return errors.Join(errs...)
}

// SweepSnapshots implements agent.DiskSnapshotter.
func (p *Provisioner) SweepSnapshots(ctx context.Context, name string) error {
	st := p.state(name, "")
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.snap != nil {
		return nil // this process holds it: ReleaseSnapshot gives it back
	}
	return p.sweep(ctx, st, p.log.WithField("vm", name))
}

// sweepAtStart runs the sweep of a VM this process has just learned of
// (after an agent restart), in the background: a guest a killed agent
// left frozen or paused is thawed at once, not at its next backup.
func (p *Provisioner) sweepAtStart(st *vmState) {
	if _, err := os.Lstat(st.path(SnapshotMarker)); err != nil {
		if fleece, _ := filepath.Glob(st.path(fleecePrefix + "*")); len(fleece) == 0 {
			return
		}
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout+thawTimeout)
		defer cancel()
		if err := p.SweepSnapshots(ctx, st.name); err != nil {
			p.log.WithField("vm", st.name).WithError(err).Warn("sweep of a killed agent's disk snapshot failed")
		}
	}()
}

// sweep removes what a snapshot left in st's QEMU and directory, judged
// by QEMU's own state and the marker: the guest is thawed (the marker
// says it may be frozen) and resumed (it says it may be paused and QEMU
// says it is), the NBD server stopped, each device on one of our filters
// switched back to the filter's child, our nodes deleted, the fleece
// files and the marker removed. With no marker and no fleece file it does
// nothing.
func (p *Provisioner) sweep(ctx context.Context, st *vmState, log *logrus.Entry) error {
	m, hasMarker := readMarker(st.dir)
	fleece, _ := filepath.Glob(st.path(fleecePrefix + "*"))
	if !hasMarker && len(fleece) == 0 {
		return nil
	}
	log.WithField("marker", hasMarker).Warn("sweeping a disk snapshot a killed agent left")
	var errs []error
	if st.pid() != 0 {
		sock := st.path(QMPSocket)
		if m.Freeze {
			st.qgaMu.Lock()
			tctx, cancel := context.WithTimeout(ctx, thawTimeout)
			if err := qgaCall(tctx, st.path(QGASocket), "guest-fsfreeze-thaw", nil, nil); err != nil {
				log.WithError(err).Info("thaw at sweep: no answer (no agent, or not frozen)")
			}
			cancel()
			st.qgaMu.Unlock()
		}
		if status, err := qmpStatus(ctx, sock); err == nil && status == "paused" && m.Pause {
			if _, err := qmpCommand(ctx, sock, "cont", nil); err != nil {
				errs = append(errs, fmt.Errorf("resume: %w", err))
			}
		}
		qmpCommand(ctx, sock, "nbd-server-stop", nil)
		have, err := namedNodes(ctx, sock)
		if err != nil {
			return err
		}
		n := 0
		for node := range have {
			if i, ok := ourNodeIndex(node); ok {
				n = max(n, i+1)
			}
		}
		errs = append(errs, delNodes(ctx, sock, n, accessNode))
		errs = append(errs, unswitchAll(ctx, sock))
		errs = append(errs, delNodes(ctx, sock, n, cbwNode, fleeceNode))
	}
	errs = append(errs, removeFleeceFiles(st.dir))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return removeVMFile(st.dir, SnapshotMarker)
}

var ourNode = regexp.MustCompile(`^gf-(fleece|cbw|access)-([0-9]{1,4})$`)

func ourNodeIndex(node string) (int, bool) {
	m := ourNode.FindStringSubmatch(node)
	if m == nil {
		return 0, false
	}
	i, _ := strconv.Atoi(m[2])
	return i, true
}

// unswitchAll switches every device on one of our filters back to the
// filter's file child, found in QEMU's block graph.
func unswitchAll(ctx context.Context, sock string) error {
	blocks, err := queryBlock(ctx, sock)
	if err != nil {
		return err
	}
	var graph struct {
		Nodes []struct {
			ID   int    `json:"id"`
			Name string `json:"name"`
		} `json:"nodes"`
		Edges []struct {
			Parent int    `json:"parent"`
			Child  int    `json:"child"`
			Name   string `json:"name"`
		} `json:"edges"`
	}
	var errs []error
	for _, b := range blocks {
		if b.Inserted == nil || !strings.HasPrefix(b.Inserted.NodeName, "gf-cbw-") {
			continue
		}
		if graph.Nodes == nil {
			ret, err := qmpCommand(ctx, sock, "x-debug-query-block-graph", nil)
			if err == nil {
				err = json.Unmarshal(ret, &graph)
			}
			if err != nil {
				return fmt.Errorf("block graph: %w", err)
			}
		}
		child := ""
		for _, n := range graph.Nodes {
			if n.Name != b.Inserted.NodeName {
				continue
			}
			for _, e := range graph.Edges {
				if e.Parent == n.ID && e.Name == "file" {
					for _, c := range graph.Nodes {
						if c.ID == e.Child {
							child = c.Name
						}
					}
				}
			}
		}
		if child == "" {
			errs = append(errs, fmt.Errorf("disk %s: the child of %s is not in the block graph", b.Device, b.Inserted.NodeName))
			continue
		}
		errs = append(errs, unswitch(ctx, sock, b.QDev, b.Inserted.NodeName, child))
	}
	return errors.Join(errs...)
}

// readMarker reads the VM's SnapshotMarker (hostile: the directory is
// QEMU's user's): false when there is none or it cannot be read, in which
// case the sweep assumes a freeze and a pause may be left.
func readMarker(dir string) (snapshotMarker, bool) {
	b, err := readVMFile(dir, SnapshotMarker, 64<<10)
	if errors.Is(err, os.ErrNotExist) {
		return snapshotMarker{}, false
	}
	var m snapshotMarker
	if err != nil || json.Unmarshal(b, &m) != nil {
		return snapshotMarker{Freeze: true, Pause: true}, true
	}
	return m, true
}

func markerJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return append(b, '\n')
}

// dropSnapshot gives back a held snapshot of a VM being destroyed (its
// QEMU is gone) and removes the fleece files; st.mu is held.
func (p *Provisioner) dropSnapshot(st *vmState) error {
	if held := st.snap; held != nil {
		st.snap = nil
		return p.release(st, held, p.log.WithField("vm", st.name))
	}
	return removeFleeceFiles(st.dir)
}
