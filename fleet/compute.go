package fleet

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/internal/redact"
	"github.com/gitfleet/gitfleet/internal/safetext"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/trust"
)

// input is everything one computation over the snapshots tip needs. The
// computation is a function of it: the same input gives the same output.
type input struct {
	// branch and path are the desired branch and the objects' directory
	// this controller is configured with; a ledger computed from others is
	// refused.
	branch string
	path   string
	// head is the desired-state commit; fleet its validated state, nil when
	// it was rejected with loadErr.
	head    desired.Hash
	fleet   *desired.Fleet
	loadErr error
	// ledger is the ledger at the snapshots tip; the computation works on a
	// clone.
	ledger *snapshots.Ledger
	// statuses are the hosts' readable statuses; statusOK is false when the
	// status branch could not be read, which disables the sweep.
	statuses map[string]*status.Status
	statusOK bool
	// unsigned are the hosts whose status may not ack deletes (its
	// commit is not signed by the Host's spec.agentKey): their acks are
	// reported as forged, never acted on. signed are the hosts whose
	// status commit that key signed.
	unsigned map[string]ackRefusal
	signed   map[string]bool
	// ownEpoch is the highest epoch this controller's own history holds
	// for a host (epochMemory): the fence recovery follows a status no
	// signature vouches for no further (nil: no bound, for tests).
	ownEpoch func(host string) uint64
	// offline reports whether the controller has seen no change of host's
	// status file for offlineAfter, and for how long.
	offline func(host string) (bool, time.Duration)
	now     time.Time
	grace   time.Duration // abandonGrace
	// attribute finds who removed each ref since ledger.Applied.
	attribute func(refs []ref) (map[ref]snapshots.Tombstone, error)
	// rewritten reports whether ledger.Applied is not an ancestor of head
	// (a force-push, a reset, an unrelated history): then objects absent
	// from head are retained, never tombstoned.
	rewritten func() (bool, error)
	// readTip reads a file at the snapshots tip (gitsource.ErrFileNotFound
	// when absent); nil skips the check of the published files.
	readTip func(path string) ([]byte, error)
	// lastSnapshot returns host's published snapshot at the tip (the last
	// specs of objects being tombstoned), nil when it has none.
	lastSnapshot func(host string) (*snapshots.Snapshot, error)
	// specHash returns the spec hash of a VM of the fleet.
	specHash func(vm *desired.VM) desired.Hash
	// verify checks the signatures of the commits the head brings (nil:
	// verification off) and returns when each commit checked was first
	// seen, for the ledger; an error wrapping trust.ErrSignature rejects
	// the head, any other is git's.
	verify func() ([]snapshots.SeenCommit, error)
	// controllerKeys are the keys whose snapshots commits the controller
	// trusts (nil without a signing key): no Host's agentKey may be one.
	controllerKeys *trust.Signers
	// appliedRange returns the commits since ledger.Applied, head first
	// (AppliedRange, WithMergedCommits): their messages carry the
	// mass-delete guard's trailer.
	appliedRange func() ([]*gitsource.Commit, bool, error)
	// deletes is the mass-delete guard.
	deletes DeleteGuard
	// desiredAt loads the desired state at a commit of the desired
	// branch's repository (an error wrapping gitsource.ErrObjectMissing
	// when it does not hold the commit). Set when the ledger is not
	// authenticated by a signature (no signing key): then a retained
	// record or a tombstone the ledger's names would create is acted on
	// only when that history shows the object (justifyRetained,
	// tombstone). Nil trusts the ledger's records.
	desiredAt func(commit desired.Hash) (*desired.Fleet, error)
	// removedBy reports whether commit, in the desired branch's history,
	// removed r: its first parent holds r there. Set
	// with desiredAt: a pending tombstone of the ledger is acted on only
	// when it does (checkTombstones).
	removedBy func(r ref, commit desired.Hash) (bool, error)
	// tip is the snapshots branch tip the ledger was read at, for reports;
	// adopted is tip when its unsigned ledger was adopted once
	// (Config.TrustUnsignedLedgerOnce), recorded in the ledger.
	tip     desired.Hash
	adopted desired.Hash
	// forged are the snapshots commits above the one whose ledger this is
	// that no controller key signed (authenticLedger), newest first.
	forged []ForgedCommit
}

// output is what the computation decided.
type output struct {
	ledger *snapshots.Ledger
	// files are snapshot paths → content (nil removes the file).
	files map[string][]byte
	// published is host → new epoch for every file written.
	published map[string]uint64
	// fenceJumps is host → epoch the ledger jumped to.
	fenceJumps map[string]uint64
	tombstoned []*snapshots.TombstoneRecord
	// retained are the objects kept after a history rewrite this pass;
	// unretained those desired again on their host.
	retained   []*snapshots.RetainedRecord
	unretained []ref
	// repaired are hosts whose file at the tip differed from the one the
	// ledger published (edited or removed by hand): published again.
	repaired  []string
	undeleted []ref
	finalized []ref
	// confirmed are the pending deletes whose host's quarantine nonce
	// this pass copied into their tombstone.
	confirmed []ref
	swept     []snapshots.SweepRecord
	// rejected is set when the desired state was refused by the
	// computation itself (a VM attaching a retained VM's volume, a
	// signature, the mass-delete guard): the output is then that of a
	// rejected commit.
	rejected error
	// ignored are the hosts whose status was ignored: not in the desired
	// state and unknown to the ledger.
	ignored []string
	// held is host → why its snapshot was not published this pass (an
	// epoch at the bound); every other host published.
	held map[string]string
	// unfollowed is host → why the fence recovery did not follow its
	// status's lastSeenEpoch (beyond this controller's own history, and
	// no signature vouches for it); the host published as usual.
	unfollowed map[string]string
	// forgedAcks are the acks not acted on: their status commit is not
	// signed by the Host's spec.agentKey.
	forgedAcks []ForgedAck
	// forgedCommits are the snapshots commits found this pass above the
	// newest one a controller key signed.
	forgedCommits []ForgedCommit
}

// MaxEpoch bounds snapshot epochs (snapshots.MaxEpoch, 2^53). The
// controller publishes and follows epochs only up to
// snapshots.MaxAcceptedEpoch, the highest an agent accepts: a host whose
// next epoch or whose status lies beyond is held (not published, reported),
// never the whole fleet.
const MaxEpoch = snapshots.MaxEpoch

// ErrLedgerMismatch is returned by a pass whose configured desired branch or
// objects' directory differs from the one the ledger on the snapshots branch
// was computed from. Publishing would read everything the other
// configuration applied as deleted; nothing is written.
var ErrLedgerMismatch = errors.New("the ledger was computed from another desired branch or path")

// ErrEpochBound is wrapped by the reason a host is held (PassResult.Held):
// its next epoch, or the epoch its status reports, is beyond
// snapshots.MaxAcceptedEpoch. The other hosts publish.
var ErrEpochBound = errors.New("epoch beyond the bound")

// fileHash identifies the bytes of a published snapshot file.
func fileHash(data []byte) desired.Hash {
	sum := sha256.Sum256(data)
	return desired.Hash(hex.EncodeToString(sum[:8]))
}

// compute runs one pass's decisions over in.ledger (docs/DESIGN.md, Controller
// semantics 1–6) as the steps of computeSteps, in order. It never returns a
// partial result: an error means nothing may be written.
func compute(in input) (*output, error) {
	p := &computePass{in: in, l: in.ledger.Clone()}
	p.out = &output{ledger: p.l, files: map[string][]byte{}, published: map[string]uint64{}, fenceJumps: map[string]uint64{}, held: map[string]string{}, unfollowed: map[string]string{}}
	for _, s := range computeSteps() {
		if err := s.run(p); err != nil {
			return nil, err
		}
		if p.done {
			break
		}
	}
	return p.out, nil
}

// computeStep is one named decision of compute. A step changes the pass's
// ledger clone and output, or returns an error that stops the pass with
// nothing written (the errors already name what to fix, so they are not
// wrapped with the step's name), or sets done to end the pass with the
// output as it stands.
type computeStep struct {
	name string
	run  func(p *computePass) error
}

// computeSteps returns compute's decisions in the order they must be
// taken: the guards first (nothing is decided over a foreign or corrupt
// branch), then what the desired state brings back, then what it drops,
// then what the hosts acknowledged, and last what is published. (A
// function, not a variable: rejectConflicts runs compute again.)
func computeSteps() []computeStep {
	return []computeStep{
		{"guard ledger", (*computePass).guardLedger},
		{"check retained records", (*computePass).checkRetained},
		{"check tombstone records", (*computePass).checkTombstones},
		{"ignore unknown hosts", (*computePass).ignoreUnknownHosts},
		{"recover fence", (*computePass).recoverFence},
		{"verify signatures", (*computePass).verifySignatures},
		{"separate agent keys", (*computePass).separateAgentKeys},
		{"keep last good", (*computePass).keepLastGood},
		{"group live objects", (*computePass).groupLive},
		{"un-retain", (*computePass).unretain},
		{"un-delete", (*computePass).undelete},
		{"tombstone or retain", (*computePass).tombstoneOrRetain},
		{"guard mass deletes", (*computePass).guardDeletes},
		{"reject conflicts", (*computePass).rejectConflicts},
		{"finalize", (*computePass).finalize},
		{"confirm quarantines", (*computePass).confirmQuarantines},
		{"record forgeries", (*computePass).recordForgeries},
		{"keep agent keys", (*computePass).keepAgentKeys},
		{"assemble snapshots", (*computePass).assemble},
		{"remove departed hosts", (*computePass).removeDeparted},
		{"publish", (*computePass).publish},
		{"record applied", (*computePass).recordApplied},
	}
}

// computePass is the state compute's steps share.
type computePass struct {
	in  input
	l   *snapshots.Ledger // a clone of in.ledger, the ledger to write
	out *output
	// snaps are the hosts' snapshots under construction, live objects
	// first (groupLive), then tombstones and retained objects (assemble).
	snaps map[string]*hostSnapshot
	// pending are the tombstones pending at the start, less those
	// un-deleted.
	pending map[ref]*snapshots.TombstoneRecord
	// done ends the pass after the current step with out as it stands.
	done bool
}

// guardLedger refuses a ledger computed from another desired branch or
// objects' directory (ErrLedgerMismatch): publishing over it would read as
// deleting everything the other configuration applied.
func (p *computePass) guardLedger() error {
	a, in := p.l.Applied, p.in
	if a == nil || (a.Branch == in.branch && (a.Path == nil || *a.Path == in.path)) {
		return nil
	}
	had := "(not recorded)"
	if a.Path != nil {
		had = dirName(*a.Path)
	}
	return fmt.Errorf("%w: %s was computed from branch %q, path %s; this controller reads branch %q, path %s: refusing to publish (start it with --branch %s --path %s, or give it its own snapshots and status branches)",
		ErrLedgerMismatch, snapshots.LedgerPath, a.Branch, had, in.branch, dirName(in.path), a.Branch, dirName(derefOr(a.Path, in.path)))
}

// ignoreUnknownHosts drops the statuses of hosts that are neither in the
// desired state nor in the ledger: anyone who can push to the status
// branch can write one, and none of them may create a ledger record, move
// an epoch or stop a pass. They are listed in the output (the controller
// reports each once).
func (p *computePass) ignoreUnknownHosts() error {
	kept := make(map[string]*status.Status, len(p.in.statuses))
	for host, st := range p.in.statuses {
		desiredHost := p.in.fleet != nil && p.in.fleet.Hosts[host] != nil
		if _, inLedger := p.l.Hosts[host]; desiredHost || inLedger {
			kept[host] = st
			continue
		}
		p.out.ignored = append(p.out.ignored, host)
	}
	sort.Strings(p.out.ignored)
	p.in.statuses = kept
	return nil
}

// recoverFence follows an agent that accepted an epoch the ledger does not
// know (the snapshots branch was restored from an old copy): the host's
// epoch jumps to it and its snapshot is forced out again. An agent fenced
// at the ledger's own epoch (it accepted other content there) gets its
// snapshot forced out at the next epoch. A status not signed by its
// Host's agentKey (in.unsigned) moves nothing: it is as forgeable as its
// acks. One no agentKey signature vouches for (a Host without agentKey)
// is followed only as far as this controller's own history goes
// (in.ownEpoch: the epochs it published or read in a ledger it computed
// on): anyone who can push to a host branch can write it, and one just
// under the bound otherwise jumped the host there and held it for good.
// A signed one is followed up to snapshots.MaxAcceptedEpoch; a jump
// beyond (no agent accepts such an epoch, so the agent's state is corrupt)
// is not followed: that host is held, and every other host publishes.
func (p *computePass) recoverFence() error {
	fenced := make([]string, 0, len(p.in.statuses))
	for host := range p.in.statuses {
		if _, forged := p.in.unsigned[host]; !forged {
			fenced = append(fenced, host)
		}
	}
	sort.Strings(fenced)
	for _, host := range fenced {
		st := p.in.statuses[host]
		rec := p.l.Host(host)
		switch {
		case st.FenceViolation && st.LastSeenEpoch == rec.Epoch:
			// The agent accepted other content at this very epoch (the
			// branch was recreated from nothing and counted up to it
			// again): only a higher epoch lifts its fence.
			rec.Hash = ""
			p.out.fenceJumps[host] = st.LastSeenEpoch
		case st.LastSeenEpoch <= rec.Epoch:
		case !p.in.signed[host] && p.in.ownEpoch != nil && st.LastSeenEpoch > p.in.ownEpoch(host):
			p.out.unfollowed[host] = fmt.Sprintf("host %s: its status (%s on %s) reports lastSeenEpoch %d, beyond %d, the highest epoch this controller published for it, and no agentKey signature vouches for it: not followed (anyone who can push to that branch can write it); if the agent really accepted it, give its Host an agentKey, or reset the agent's epoch (docs/DESIGN.md, \"Resetting an agent's epoch\")",
				host, status.Path(host), status.HostBranch(host), st.LastSeenEpoch, p.in.ownEpoch(host))
		case st.LastSeenEpoch > snapshots.MaxAcceptedEpoch:
			p.out.held[host] = fmt.Errorf("%w: host %s: its status (%s on the status branch) reports lastSeenEpoch %d, above %d, the highest epoch an agent accepts: not followed, and the host's snapshot is held; correct or remove that status file, or reset the agent's epoch (docs/DESIGN.md, \"Resetting an agent's epoch\")",
				ErrEpochBound, host, status.Path(host), st.LastSeenEpoch, snapshots.MaxAcceptedEpoch).Error()
		default:
			rec.Epoch = st.LastSeenEpoch
			rec.Hash = ""
			p.out.fenceJumps[host] = st.LastSeenEpoch
		}
	}
	return nil
}

// verifySignatures rejects a head whose commits are not signed as the
// verification mode asks (trust.ErrSignature), like an invalid commit: the
// last good snapshots stay. Git's failure to read a signature ends the
// pass instead.
func (p *computePass) verifySignatures() error {
	if p.in.fleet == nil || p.in.verify == nil {
		return nil
	}
	seen, err := p.in.verify()
	if err == nil || errors.Is(err, trust.ErrSignature) {
		p.l.SignaturesSeen = seen
	}
	if err == nil {
		return nil
	}
	if !errors.Is(err, trust.ErrSignature) {
		return fmt.Errorf("verify signatures: %w", err)
	}
	p.in.fleet, p.in.loadErr = nil, err
	p.out.rejected = err
	return nil
}

// ErrAgentKeyIsControllerKey is wrapped by the rejection of a desired
// state in which a Host's spec.agentKey is a key whose snapshots commits
// the controller trusts.
var ErrAgentKeyIsControllerKey = errors.New("a Host's agentKey is a controller key")

// separateAgentKeys rejects a desired state whose Host names a controller
// key (this controller's or one of --controller-keys) as its agentKey:
// that agent signs its status commits, on a host branch whose tree anyone
// who can push chose, with a key agents and the ledger walk take for the
// controller's, so any of them pushed to the snapshots branch would be a
// snapshots commit "a controller wrote".
func (p *computePass) separateAgentKeys() error {
	if p.in.fleet == nil || p.in.controllerKeys == nil {
		return nil
	}
	names := make([]string, 0, len(p.in.fleet.Hosts))
	for name := range p.in.fleet.Hosts {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		h := p.in.fleet.Hosts[name]
		if h.Spec.AgentKey == "" {
			continue
		}
		keys, err := trust.ParseKeys("Host "+name+" spec.agentKey", []string{h.Spec.AgentKey})
		if err != nil || len(keys) != 1 || !p.in.controllerKeys.HoldsSSH(keys[0].Fingerprint()) {
			continue // a bad key is the loader's to report
		}
		err = fmt.Errorf("%w: %s: Host %s spec.agentKey %s is a controller key: its agent's signed status commits would pass for snapshots commits; give the agent its own key (gitfleet keygen --host %s)",
			ErrAgentKeyIsControllerKey, h.Origin.File, name, keys[0].Fingerprint(), name)
		p.in.fleet, p.in.loadErr = nil, err
		p.out.rejected = err
		return nil
	}
	return nil
}

// keepLastGood ends the pass of a rejected desired state: the last good
// snapshots stay untouched, and the ledger only remembers why (once per
// commit and reason, keeping when it was first refused) and the forged
// snapshots commits found (recordForgeries).
func (p *computePass) keepLastGood() error {
	if p.in.fleet != nil {
		return nil
	}
	reason := "unknown error"
	if p.in.loadErr != nil {
		// Written to ledger.yaml and README.md: a fetch error may quote the
		// remote's URL with its token; valid UTF-8, no control characters,
		// the first errors of a long list and a count.
		reason = safetext.Lines(redact.Text(p.in.loadErr.Error()))
	}
	if r := p.l.Rejected; r == nil || r.Commit != p.in.head || r.Reason != reason || r.Superseded != "" {
		p.l.Rejected = &snapshots.Rejection{Commit: p.in.head, Reason: reason, At: p.in.now}
	}
	p.done = true
	// The forged snapshots commits found under a rejected head are
	// reported too: the pass writes over them.
	return p.recordForgeries()
}

// groupLive groups the live objects per host, sorted by name, without
// specs: a spec is copied only into a snapshot that is written (publish).
func (p *computePass) groupLive() error {
	p.snaps = buildSnapshots(p.in.fleet, nil, p.in.specHash, false)
	p.pending = map[ref]*snapshots.TombstoneRecord{}
	for _, t := range p.l.Tombstones {
		p.pending[t.Ref()] = t
	}
	return nil
}

// live reports whether r is desired on its host.
func (p *computePass) live(r ref) bool { return p.snaps[r.Host].has(r.Kind, r.Name) }

// unretain takes a retained object desired on its host again off the
// list. Desired on another host, it stays retained on its old one.
func (p *computePass) unretain() error {
	kept := p.l.Retained[:0:0]
	for _, r := range p.l.Retained {
		if p.live(r.Ref()) {
			p.out.unretained = append(p.out.unretained, r.Ref())
			continue
		}
		kept = append(kept, r)
	}
	p.l.Retained = kept
	return nil
}

// undelete drops the pending tombstone of an object back on its host: the
// object keeps what it had (a VM its disk).
func (p *computePass) undelete() error {
	kept := p.l.Tombstones[:0:0]
	for _, t := range p.l.Tombstones {
		if p.live(t.Ref()) {
			p.out.undeleted = append(p.out.undeleted, t.Ref())
			delete(p.pending, t.Ref())
			continue
		}
		kept = append(kept, t)
	}
	p.l.Tombstones = kept
	return nil
}

// tombstoneOrRetain handles the objects of the applied state absent now,
// or moved: tombstoned when the applied commit is an ancestor of the head
// (a reviewed delete), retained when the history was rewritten.
func (p *computePass) tombstoneOrRetain() error {
	if p.l.Applied == nil {
		return nil
	}
	removed := p.removed()
	if len(removed) == 0 {
		return nil
	}
	rewritten, err := p.in.rewritten()
	if err != nil {
		return fmt.Errorf("is the applied commit %s an ancestor of %s: %w", p.l.Applied.Commit.Short(), p.in.head.Short(), err)
	}
	if rewritten {
		return p.retain(removed)
	}
	return p.tombstone(removed)
}

// removed lists the objects the ledger's hosts held in the applied state
// that their hosts' snapshots now lack and that have no pending tombstone,
// sorted.
func (p *computePass) removed() []ref {
	var removed []ref
	for host, rec := range p.l.Hosts {
		s := p.snaps[host]
		var vms []snapshots.SnapshotVM
		var vols []snapshots.SnapshotVolume
		if s != nil {
			vms, vols = s.snap.VMs, s.snap.Volumes
		}
		// Both lists are sorted by name: walk them together.
		for _, n := range missing(rec.VMs, len(vms), func(i int) string { return vms[i].Name }) {
			if r := (ref{Kind: desired.KindVM, Name: n, Host: host}); p.pending[r] == nil {
				removed = append(removed, r)
			}
		}
		for _, n := range missing(rec.Volumes, len(vols), func(i int) string { return vols[i].Name }) {
			if r := (ref{Kind: desired.KindVolume, Name: n, Host: host}); p.pending[r] == nil {
				removed = append(removed, r)
			}
		}
	}
	sort.Slice(removed, func(i, j int) bool { return removed[i].String() < removed[j].String() })
	return removed
}

// retain keeps every object a rewritten history dropped, live, with its
// last spec: a rewritten history is no reviewed delete. A VM without a last
// spec is refused (ErrNoLastSpec): publishing it without its spec would
// read as a vanished VM.
func (p *computePass) retain(removed []ref) error {
	for _, r := range removed {
		last, err := p.in.lastSnapshot(r.Host)
		if err != nil {
			return fmt.Errorf("last spec of %s: %w", r, err)
		}
		k := &snapshots.RetainedRecord{Kind: r.Kind, Name: r.Name, Host: r.Host, Commit: p.in.head, Since: p.in.now}
		t := &snapshots.TombstoneRecord{Kind: r.Kind}
		t.Name = r.Name
		fillLast(t, last)
		k.Spec, k.SizeGB = t.Spec, t.SizeGB
		k.From = p.l.Applied.Commit
		if k.Kind == desired.KindVM && k.Spec == nil {
			return fmt.Errorf("%w: VM %s on host %s, dropped by the history rewrite at %s, has no last spec: %s is missing or unreadable on the snapshots branch; restore that file, or restore the VM's file on the desired branch",
				ErrNoLastSpec, r.Name, r.Host, p.in.head.Short(), snapshots.Path(r.Host))
		}
		why, err := p.justifyRetained(k)
		if err != nil {
			return err
		}
		if why != "" {
			p.refuseRecord(fmt.Sprintf("%s to retain: %s", refName(r), why))
			continue
		}
		p.l.Retained = append(p.l.Retained, k)
		p.out.retained = append(p.out.retained, k)
	}
	return nil
}

// checkRetained drops, when the ledger is not authenticated (desiredAt
// set), every retained record the desired branch's history does not
// justify (justifyRetained): it is not published, and reported.
func (p *computePass) checkRetained() error {
	if p.in.desiredAt == nil || len(p.l.Retained) == 0 {
		return nil
	}
	kept := p.l.Retained[:0:0]
	for _, k := range p.l.Retained {
		why, err := p.justifyRetained(k)
		if err != nil {
			return err
		}
		if why != "" {
			p.refuseRecord(fmt.Sprintf("retained %s: %s", refName(k.Ref()), why))
			continue
		}
		kept = append(kept, k)
	}
	p.l.Retained = kept
	return nil
}

// checkTombstones drops, when the ledger is not authenticated, every
// pending tombstone whose commit did not remove its object in the desired
// branch's history (removedBy): it is never published, and reported. The
// object, if its host runs it, is then kept there as vanished, never
// destroyed.
func (p *computePass) checkTombstones() error {
	if p.in.removedBy == nil || len(p.l.Tombstones) == 0 {
		return nil
	}
	kept := p.l.Tombstones[:0:0]
	for _, t := range p.l.Tombstones {
		ok, err := p.in.removedBy(t.Ref(), t.Tombstone.Commit)
		if err != nil {
			return fmt.Errorf("check the tombstone of %s: %w", refName(t.Ref()), err)
		}
		if !ok {
			p.refuseRecord(fmt.Sprintf("tombstone of %s: its commit %s is not a commit of the desired branch's history that removed it", refName(t.Ref()), t.Tombstone.Commit.Short()))
			continue
		}
		kept = append(kept, t)
	}
	p.l.Tombstones = kept
	return nil
}

// justifyRetained returns "" when k may be published: the ledger is
// authenticated (desiredAt nil), or k.From, read from the desired
// branch's repository (which holds only what was fetched from the desired
// branch), holds the object on k.Host with k's spec (VM) or size
// (Volume). Else why not; an error is git's.
func (p *computePass) justifyRetained(k *snapshots.RetainedRecord) (string, error) {
	if p.in.desiredAt == nil {
		return "", nil
	}
	if k.From == "" {
		return "the record names no commit it was desired at (from)", nil
	}
	f, err := p.in.desiredAt(k.From)
	if errors.Is(err, gitsource.ErrObjectMissing) {
		// A fresh clone after the rewrite no longer holds the commit:
		// the host's own report is the witness left.
		if p.hostRuns(k) {
			return "", nil
		}
		return fmt.Sprintf("its commit %s is not in the desired branch's history this controller holds, and host %s does not report it with that spec or size (signed by its agentKey when its Host names one)", k.From.Short(), k.Host), nil
	}
	if err != nil {
		return "", fmt.Errorf("read %s, where retained %s was desired: %w", k.From.Short(), refName(k.Ref()), err)
	}
	if !holds(f, k.Ref()) {
		return fmt.Sprintf("the commit %s does not hold it on host %s", k.From.Short(), k.Host), nil
	}
	switch {
	case k.Kind == desired.KindVM && (k.Spec == nil || desired.SpecHash(*k.Spec) != desired.SpecHash(f.VMs[k.Name].Spec)):
		return fmt.Sprintf("its spec is not the one the commit %s gives it", k.From.Short()), nil
	case k.Kind == desired.KindVolume && k.SizeGB != f.Volumes[k.Name].Spec.SizeGB:
		return fmt.Sprintf("its size is not the one the commit %s gives it", k.From.Short()), nil
	}
	return "", nil
}

// hostRuns reports whether k's host reports k as it is: a VM of k's name
// with k's spec hash, a volume present at k's size, in a status whose acks
// the controller would take (signed by the Host's agentKey when it names
// one). Publishing such a record changes nothing on the host.
func (p *computePass) hostRuns(k *snapshots.RetainedRecord) bool {
	st := p.in.statuses[k.Host]
	if _, unsigned := p.in.unsigned[k.Host]; st == nil || unsigned {
		return false
	}
	switch k.Kind {
	case desired.KindVM:
		if k.Spec == nil {
			return false
		}
		want := desired.SpecHash(*k.Spec)
		for _, vm := range st.VMs {
			if vm.Name == k.Name && vm.SpecHash == want {
				return true
			}
		}
	case desired.KindVolume:
		for _, v := range st.Volumes {
			if v.Name == k.Name && v.Present && v.SizeGB == k.SizeGB {
				return true
			}
		}
	}
	return false
}

// holds reports whether f has the object r names on r's host.
func holds(f *desired.Fleet, r ref) bool {
	switch r.Kind {
	case desired.KindVM:
		vm := f.VMs[r.Name]
		return vm != nil && vm.Spec.Host == r.Host
	case desired.KindVolume:
		v := f.Volumes[r.Name]
		return v != nil && v.Spec.Host == r.Host
	}
	return false
}

// refuseRecord reports a ledger record the pass did not act on (it is
// not justified by the desired branch's history), as a forgery found at
// the snapshots tip.
func (p *computePass) refuseRecord(why string) {
	p.out.forgedCommits = append(p.out.forgedCommits, ForgedCommit{Commit: string(p.in.tip), Reason: "ledger record not acted on: " + why})
}

// tombstone records a pending delete of every removed object, attributed
// to the commit that removed it and carrying its last spec. Its epoch is
// set when it is first published.
func (p *computePass) tombstone(removed []ref) error {
	who, err := p.in.attribute(removed)
	if err != nil {
		return fmt.Errorf("attribute deletes: %w", err)
	}
	var applied *desired.Fleet
	if p.in.desiredAt != nil {
		if applied, err = p.in.desiredAt(p.l.Applied.Commit); err != nil {
			// An ancestor of the head (rewritten said so): git's failure.
			return fmt.Errorf("read the applied commit %s: %w", p.l.Applied.Commit.Short(), err)
		}
	}
	for _, r := range removed {
		if applied != nil && !holds(applied, r) {
			// A name the ledger lists that the applied commit never
			// held there: ledger content nobody reviewed deletes nothing.
			p.refuseRecord(fmt.Sprintf("%s listed in %s hosts.%s but absent from the applied commit %s: not tombstoned",
				refName(r), snapshots.LedgerPath, r.Host, p.l.Applied.Commit.Short()))
			continue
		}
		t := &snapshots.TombstoneRecord{Kind: r.Kind, Name: r.Name, Host: r.Host, Tombstone: who[r], PublishedAt: p.in.now}
		t.Tombstone.Epoch = 0 // set when published
		last, err := p.in.lastSnapshot(r.Host)
		if err != nil {
			return fmt.Errorf("last spec of %s: %w", r, err)
		}
		fillLast(t, last)
		p.l.Tombstones = append(p.l.Tombstones, t)
		p.out.tombstoned = append(p.out.tombstoned, t)
	}
	return nil
}

// guardDeletes rejects a desired state that newly tombstones more
// objects than the mass-delete guard allows (DeleteGuard), unless a commit
// since the applied one carries the AllowDeletesTrailer with a count that
// covers them.
func (p *computePass) guardDeletes() error {
	d := Deletes{VMs: map[string]int{}, Held: map[string]int{}}
	for _, t := range p.out.tombstoned {
		d.Total++
		if t.Kind == desired.KindVM {
			d.VMs[t.Host]++
			if rec := p.in.ledger.Hosts[t.Host]; rec != nil {
				d.Held[t.Host] = len(rec.VMs)
			}
		}
	}
	if p.in.deletes.Trips(d) == "" {
		return nil
	}
	allowed, found := 0, false
	if p.in.appliedRange != nil {
		rng, _, err := p.in.appliedRange()
		if err != nil {
			return fmt.Errorf("read the messages since the applied commit: %w", err)
		}
		allowed, found = AllowedDeletes(rng)
	}
	if err := p.in.deletes.Check(d, allowed, found); err != nil {
		return p.reject(err)
	}
	return nil
}

// rejectConflicts rejects a desired state in which a live VM attaches a
// volume a retained VM on its host lists (it would share that volume).
func (p *computePass) rejectConflicts() error {
	if err := retainedConflict(p.in.fleet, p.l.Retained); err != nil {
		return p.reject(err)
	}
	return nil
}

// reject makes the pass's output that of a desired state rejected with
// err, computed afresh, and ends the pass.
func (p *computePass) reject(err error) error {
	rej := p.in
	rej.fleet, rej.loadErr = nil, err
	o, cerr := compute(rej)
	if cerr != nil {
		return cerr
	}
	o.rejected = err
	p.out, p.done = o, true
	return nil
}

// finalize ends a published tombstone on a fresh ack (docs/DESIGN.md, the
// epoch rule); an ack from a host whose status commit is not signed by its
// Host's spec.agentKey is reported as forged and not acted on. The abandoned sweep, when its host is offline past the
// abandon grace (never when the statuses could not be read), marks it swept
// but keeps it: it stays in the host's snapshot until the host acks, so a
// swept delete still completes on a host that comes back. A tombstone not
// yet published (epoch 0) is never finalized.
func (p *computePass) finalize() error {
	in := p.in
	kept := p.l.Tombstones[:0:0]
	for _, t := range p.l.Tombstones {
		if t.Tombstone.Epoch == 0 {
			kept = append(kept, t)
			continue
		}
		if st := in.statuses[t.Host]; st != nil && acked(st, t) {
			r, forged := in.unsigned[t.Host]
			if !forged {
				p.out.finalized = append(p.out.finalized, t.Ref())
				continue
			}
			// Never acted on: the tombstone stays pending (and may
			// still be swept if the host goes offline).
			p.out.forgedAcks = append(p.out.forgedAcks, ForgedAck{Ref: refName(t.Ref()), Commit: r.commit, Reason: r.why})
		}
		if t.SweptAt == nil && in.statusOK && in.now.Sub(t.PublishedAt) > in.grace {
			if off, since := in.offline(t.Host); off {
				sw := snapshots.SweepRecord{Kind: t.Kind, Name: t.Name, Host: t.Host, Commit: t.Tombstone.Commit, At: in.now,
					Reason: fmt.Sprintf("host offline: no status change for %s; pending for %s (abandon grace %s); the tombstone stays delivered until the host acks",
						since.Round(time.Second), in.now.Sub(t.PublishedAt).Round(time.Second), in.grace)}
				p.out.swept = append(p.out.swept, sw)
				p.l.Sweeps = append(p.l.Sweeps, sw)
				// Finalized for the fleet, still delivered to the host: a
				// host that comes back destroys it as a normal delete.
				at := in.now
				swept := *t
				swept.SweptAt = &at
				t = &swept
			}
		}
		kept = append(kept, t)
	}
	p.l.Tombstones = kept
	if n := len(p.l.Sweeps); n > snapshots.MaxSweeps {
		p.l.Sweeps = append([]snapshots.SweepRecord(nil), p.l.Sweeps[n-snapshots.MaxSweeps:]...)
	}
	return nil
}

// confirmQuarantines confirms the quarantines of pending deletes
// (docs/DESIGN.md, "Delete confirmation"): for every tombstone still
// pending in the ledger this pass computes on and already published, the
// nonce its host's status gives the object's quarantine (Quarantined for
// a VM, QuarantinedVolumes for a volume) is copied into the tombstone's
// Confirm, and so into the host's snapshot (a content change: a new
// epoch). A nonce is taken only from a status that has seen the epoch
// that published the tombstone (the ack rule: an older quarantine belongs
// to another delete) and whose acks count (signed by the Host's agentKey
// when it names one), and only when it is well-formed
// (snapshots.ValidConfirm). It runs only in a pass that applied the
// desired head: the confirmation says that the latest reviewed intent
// still deletes the object. A status, forged or not, can only ever have a
// pending delete confirmed: an object without one gets nothing.
func (p *computePass) confirmQuarantines() error {
	in := p.in
	if in.fleet == nil {
		return nil
	}
	for _, t := range p.l.Tombstones {
		st := in.statuses[t.Host]
		if st == nil || t.Tombstone.Epoch == 0 || st.LastSeenEpoch < t.Tombstone.Epoch {
			continue
		}
		if _, forged := in.unsigned[t.Host]; forged {
			continue
		}
		list := st.Quarantined
		if t.Kind == desired.KindVolume {
			list = st.QuarantinedVolumes
		}
		for _, q := range list {
			if q.Name != t.Name || !snapshots.ValidConfirm(q.Confirm) || q.Confirm == t.Tombstone.Confirm {
				continue
			}
			t.Tombstone.Confirm = q.Confirm
			p.out.confirmed = append(p.out.confirmed, t.Ref())
		}
	}
	return nil
}

// recordForgeries keeps in the ledger what this pass refused as forged:
// the acks not acted on (this pass's, replacing the last pass's) and the
// snapshots commits no controller key signed (added to those found
// before, oldest first, at most snapshots.MaxForgedCommits), so README.md
// and `gitfleet status` show them after the branch was repaired.
func (p *computePass) recordForgeries() error {
	if p.in.adopted != "" {
		p.l.Adopted = &snapshots.Adoption{Commit: p.in.adopted, At: p.in.now}
	}
	if p.in.fleet != nil { // a rejected pass read no acks: the last stay
		p.l.ForgedAcks = nil
		for _, f := range p.out.forgedAcks {
			p.l.ForgedAcks = append(p.l.ForgedAcks, snapshots.ForgedAckRecord{Ref: f.Ref, Commit: desired.Hash(f.Commit), Reason: f.Reason})
		}
	}
	known := make(map[string]bool, len(p.l.ForgedCommits))
	for _, f := range p.l.ForgedCommits {
		known[string(f.Commit)+"\x00"+f.Reason] = true
	}
	found := make([]ForgedCommit, 0, len(p.in.forged)+len(p.out.forgedCommits))
	for i := len(p.in.forged) - 1; i >= 0; i-- { // oldest first
		found = append(found, p.in.forged[i])
	}
	found = append(found, p.out.forgedCommits...) // refused records
	p.out.forgedCommits = found
	for _, f := range found {
		reason := safetext.Lines(f.Reason)
		if known[f.Commit+"\x00"+reason] {
			continue
		}
		known[f.Commit+"\x00"+reason] = true
		p.l.ForgedCommits = append(p.l.ForgedCommits, snapshots.ForgedCommitRecord{Commit: desired.Hash(f.Commit),
			Signed: desired.Hash(f.Signed), Reason: reason, At: p.in.now})
	}
	if n := len(p.l.ForgedCommits); n > snapshots.MaxForgedCommits {
		p.l.ForgedCommits = append([]snapshots.ForgedCommitRecord(nil), p.l.ForgedCommits[n-snapshots.MaxForgedCommits:]...)
	}
	return nil
}

// keepAgentKeys records each desired Host's spec.agentKey in its ledger
// record, and keeps it there after the Host object left the desired
// state: the acks of the deletes still pending on that host are verified
// against it (authenticate). A Host desired without agentKey clears it.
func (p *computePass) keepAgentKeys() error {
	if p.in.fleet == nil {
		return nil
	}
	for name, h := range p.in.fleet.Hosts {
		if rec := p.l.Hosts[name]; rec != nil || h.Spec.AgentKey != "" {
			p.l.Host(name).AgentKey = h.Spec.AgentKey
		}
	}
	return nil
}

// assemble completes every host's snapshot content: the pending tombstones,
// then the applied names recorded in the ledger (the live objects only),
// then the retained objects, published live but kept out of the applied
// names, so that a later commit lacking them is no delete of theirs.
func (p *computePass) assemble() error {
	addTombstones(p.snaps, p.l.Tombstones)
	for host, rec := range p.l.Hosts {
		if p.snaps[host] == nil {
			rec.VMs, rec.Volumes = nil, nil
		}
	}
	for host, s := range p.snaps {
		rec := p.l.Host(host)
		rec.VMs, rec.Volumes = s.liveNames()
	}
	addRetained(p.snaps, p.l.Retained)
	return p.keepRetainedHostSpecs()
}

// keepRetainedHostSpecs gives a host that left the desired state with a
// rewrite its last host spec (capacity, networks) while it holds retained
// objects.
func (p *computePass) keepRetainedHostSpecs() error {
	for _, k := range p.l.Retained {
		s := p.snaps[k.Host]
		if _, ok := p.in.fleet.Hosts[k.Host]; ok || s == nil || s.hostSpecSet {
			continue
		}
		last, err := p.in.lastSnapshot(k.Host)
		if err != nil {
			return fmt.Errorf("last host spec of %s: %w", k.Host, err)
		}
		if last != nil {
			s.snap.HostSpec = last.HostSpec
		}
		s.hostSpecSet = true
	}
	return nil
}

// removeDeparted removes the file of a host that left the fleet and has
// nothing pending or retained; its epoch stays in the ledger so it is never
// reused.
func (p *computePass) removeDeparted() error {
	for host, rec := range p.l.Hosts {
		if _, ok := p.snaps[host]; !ok && rec.Hash != "" {
			p.out.files[snapshots.Path(host)] = nil
			rec.Hash, rec.File = "", ""
		}
	}
	return nil
}

// publish writes, with the next epoch, every host whose snapshot content
// changed, or whose file at the snapshots tip is not the one this
// computation gives (repaired). A held host (its epoch at the bound) is
// left as it is.
func (p *computePass) publish() error {
	hosts := make([]string, 0, len(p.snaps))
	for h := range p.snaps {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, host := range hosts {
		if _, held := p.out.held[host]; held {
			continue
		}
		s := p.snaps[host]
		rec := p.l.Host(host)
		key := contentKey(s.snap)
		if key == rec.Hash {
			same, err := p.genuine(host, s)
			if err != nil {
				return err
			}
			if same {
				continue
			}
			p.out.repaired = append(p.out.repaired, host)
		}
		if rec.Epoch+1 > snapshots.MaxAcceptedEpoch {
			p.out.held[host] = fmt.Errorf("%w: host %s: the next epoch would be %d, above %d, the highest an agent accepts: its snapshot is held; reset the agent's epoch and the host's ledger record (docs/DESIGN.md, \"Resetting an agent's epoch\")",
				ErrEpochBound, host, rec.Epoch+1, snapshots.MaxAcceptedEpoch).Error()
			continue
		}
		data, err := p.render(host, s, rec.Epoch+1, snapshots.SnapshotSource{Commit: p.in.head, Branch: p.in.branch}, true)
		if err != nil {
			return err
		}
		rec.Epoch++
		rec.Hash = key
		rec.File = fileHash(data)
		p.out.files[snapshots.Path(host)] = data
		p.out.published[host] = rec.Epoch
	}
	return nil
}

// render encodes host's snapshot s at epoch with source: the live specs
// of the desired state, the tombstones' epochs as the ledger records them
// (0, not yet published: epoch). stamp records that epoch on those
// tombstones; without it s and the ledger are left as they are.
func (p *computePass) render(host string, s *hostSnapshot, epoch uint64, source snapshots.SnapshotSource, stamp bool) ([]byte, error) {
	snap := *s.snap
	snap.VMs = append([]snapshots.SnapshotVM(nil), s.snap.VMs...)
	snap.Volumes = append([]snapshots.SnapshotVolume(nil), s.snap.Volumes...)
	for i := range snap.VMs {
		vm := &snap.VMs[i]
		if !vm.Tombstoned && !s.kept[vm.Name] {
			vm.Spec = p.in.fleet.VMs[vm.Name].Spec
		}
		if vm.Tombstone != nil {
			tb := *vm.Tombstone
			vm.Tombstone = &tb
		}
	}
	for i := range snap.Volumes {
		if v := &snap.Volumes[i]; v.Tombstone != nil {
			tb := *v.Tombstone
			v.Tombstone = &tb
		}
	}
	snap.Epoch = epoch
	snap.Source = source
	// The snapshot's tombstones carry the epoch their ledger record holds.
	tombEpoch := map[ref]uint64{}
	for _, t := range s.tombs {
		e := t.Tombstone.Epoch
		if e == 0 {
			e = epoch
			if stamp {
				t.Tombstone.Epoch = epoch
			}
		}
		tombEpoch[t.Ref()] = e
	}
	for i := range snap.VMs {
		if tb := snap.VMs[i].Tombstone; tb != nil {
			tb.Epoch = tombEpoch[ref{Kind: desired.KindVM, Name: snap.VMs[i].Name, Host: host}]
		}
	}
	for i := range snap.Volumes {
		if tb := snap.Volumes[i].Tombstone; tb != nil {
			tb.Epoch = tombEpoch[ref{Kind: desired.KindVolume, Name: snap.Volumes[i].Name, Host: host}]
		}
	}
	return snapshots.MarshalSnapshot(&snap)
}

// genuine reports whether host's file at the snapshots tip is the snapshot
// this computation gives for it, at the host's epoch, compared byte for
// byte with one rendered afresh (only its source commit, informational,
// is taken from the file). The ledger's own record of what it published
// (hosts[h].file) is never the witness: it lives on the same branch as
// the file and is forged as easily. A missing or unparsable file, or one
// edited in any other way, is not genuine. A read error other than "not
// found" is returned. True without reading when the tip is known to hold
// the files this controller wrote (readTip nil).
func (p *computePass) genuine(host string, s *hostSnapshot) (bool, error) {
	read := p.in.readTip
	if read == nil {
		return true, nil
	}
	data, err := read(snapshots.Path(host))
	if errors.Is(err, gitsource.ErrFileNotFound) || errors.Is(err, gitsource.ErrFileTooLarge) || errors.Is(err, gitsource.ErrNotAFile) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s: %w", snapshots.Path(host), err)
	}
	onTip, err := snapshots.ParseSnapshot(data)
	if err != nil || onTip.Host != host || onTip.Source.Branch != p.in.branch {
		return false, nil
	}
	want, err := p.render(host, s, p.l.Host(host).Epoch, onTip.Source, false)
	if err != nil {
		return false, err
	}
	return bytes.Equal(want, data), nil
}

// recordApplied records head as the applied commit, with the branch and
// path it was read from, and marks a standing rejection superseded by it.
func (p *computePass) recordApplied() error {
	path := p.in.path
	p.l.Applied = &snapshots.AppliedCommit{Commit: p.in.head, Branch: p.in.branch, Path: &path}
	if p.l.Rejected != nil && p.l.Rejected.Superseded == "" {
		p.l.Rejected.Superseded = p.in.head
	}
	return nil
}

// ErrNoLastSpec is returned by a pass that would retain a VM after a
// history rewrite but finds no last spec of it (its host's snapshot file is
// missing from the snapshots tip or unreadable); nothing is written.
var ErrNoLastSpec = errors.New("no last spec of a VM to retain")

// ErrRetainedVolume is wrapped by the rejection of a desired state in which
// a live VM attaches a volume that a retained VM on the same host lists.
var ErrRetainedVolume = errors.New("volume attached by a retained VM")

// retainedConflict returns an error wrapping ErrRetainedVolume naming the
// first (by VM name) live VM of f that attaches a volume a retained VM on
// the same host lists, nil when there is none. Retained VMs desired again on
// their host have already left kept.
func retainedConflict(f *desired.Fleet, kept []*snapshots.RetainedRecord) error {
	type hv struct{ host, vol string }
	holders := map[hv]*snapshots.RetainedRecord{}
	for _, k := range kept {
		if k.Kind != desired.KindVM || k.Spec == nil {
			continue
		}
		for _, v := range k.Spec.Volumes {
			if holders[hv{k.Host, v}] == nil {
				holders[hv{k.Host, v}] = k
			}
		}
	}
	if len(holders) == 0 {
		return nil
	}
	names := make([]string, 0, len(f.VMs))
	for n := range f.VMs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		vm := f.VMs[n]
		for _, v := range vm.Spec.Volumes {
			k := holders[hv{vm.Spec.Host, v}]
			if k == nil || k.Name == n {
				continue
			}
			file := ""
			if vm.Origin.File != "" {
				file = " (" + vm.Origin.File + ")"
			}
			return fmt.Errorf("%w: VM %s%s attaches volume %s on host %s, which VM %s lists: VM %s was kept after a history rewrite at %s; restore its file or re-add and delete it first",
				ErrRetainedVolume, n, file, v, vm.Spec.Host, k.Name, k.Name, k.Commit.Short())
		}
	}
	return nil
}

// dirName shows an objects' directory for a person.
func dirName(p string) string {
	if p == "" {
		return "(the repository root)"
	}
	return strconv.Quote(p)
}

func derefOr(p *string, def string) string {
	if p == nil {
		return def
	}
	return *p
}

// addRetained adds the retained objects to their hosts' snapshots as live
// entries with their last spec (VM) or size (Volume). A VM whose last spec
// is unknown is left out (publishing an empty spec would read as an edit).
func addRetained(out map[string]*hostSnapshot, kept []*snapshots.RetainedRecord) {
	touched := map[*hostSnapshot]bool{}
	for _, r := range kept {
		if r.Kind == desired.KindVM && r.Spec == nil {
			continue
		}
		s := out[r.Host]
		if s == nil {
			s = &hostSnapshot{snap: &snapshots.Snapshot{Host: r.Host, VMs: []snapshots.SnapshotVM{}, Volumes: []snapshots.SnapshotVolume{}}}
			out[r.Host] = s
		}
		if s.has(r.Kind, r.Name) {
			continue
		}
		touched[s] = true
		switch r.Kind {
		case desired.KindVM:
			if s.kept == nil {
				s.kept = map[string]bool{}
			}
			s.kept[r.Name] = true
			s.snap.VMs = append(s.snap.VMs, snapshots.SnapshotVM{Name: r.Name, Spec: *r.Spec, SpecHash: desired.SpecHash(*r.Spec)})
		case desired.KindVolume:
			s.snap.Volumes = append(s.snap.Volumes, snapshots.SnapshotVolume{Name: r.Name, SizeGB: r.SizeGB})
		}
	}
	for s := range touched {
		sortEntries(s)
	}
}

// missing returns the names of had (sorted) that the sorted list of n
// names given by name(i) lacks.
func missing(had []string, n int, name func(int) string) []string {
	var out []string
	j := 0
	for _, h := range had {
		for j < n && name(j) < h {
			j++
		}
		if j >= n || name(j) != h {
			out = append(out, h)
		}
	}
	return out
}

// fillLast copies a tombstoned object's last spec (VM) or size (Volume)
// from its host's published snapshot, when it is there.
func fillLast(t *snapshots.TombstoneRecord, last *snapshots.Snapshot) {
	if last == nil {
		return
	}
	switch t.Kind {
	case desired.KindVM:
		for _, vm := range last.VMs {
			if vm.Name == t.Name {
				spec := vm.Spec
				t.Spec = &spec
			}
		}
	case desired.KindVolume:
		for _, v := range last.Volumes {
			if v.Name == t.Name {
				t.SizeGB = v.SizeGB
			}
		}
	}
}

// acked applies the epoch rule: the host's status lists the destroy (VM) or
// the volume as absent, and has seen at least the epoch that published the
// tombstone. An older ack belongs to an older incarnation of the name.
func acked(st *status.Status, t *snapshots.TombstoneRecord) bool {
	if st.LastSeenEpoch < t.Tombstone.Epoch {
		return false
	}
	switch t.Kind {
	case desired.KindVM:
		for _, n := range st.Destroyed {
			if n == t.Name {
				return true
			}
		}
	case desired.KindVolume:
		for _, v := range st.Volumes {
			if v.Name == t.Name && !v.Present {
				return true
			}
		}
	}
	return false
}

// hostSnapshot is a snapshot under construction and the ledger tombstones it
// carries.
type hostSnapshot struct {
	snap  *snapshots.Snapshot
	tombs []*snapshots.TombstoneRecord
	// kept names the retained VMs, whose specs come from the ledger.
	kept map[string]bool
	// hostSpecSet is true once a retained-only host got its last spec.
	hostSpecSet bool
}

// has reports whether s holds a live object of kind named name (s may be
// nil). The lists are sorted by name.
func (s *hostSnapshot) has(kind desired.Kind, name string) bool {
	if s == nil {
		return false
	}
	switch kind {
	case desired.KindVM:
		i := sort.Search(len(s.snap.VMs), func(i int) bool { return s.snap.VMs[i].Name >= name })
		return i < len(s.snap.VMs) && s.snap.VMs[i].Name == name && !s.snap.VMs[i].Tombstoned
	case desired.KindVolume:
		i := sort.Search(len(s.snap.Volumes), func(i int) bool { return s.snap.Volumes[i].Name >= name })
		return i < len(s.snap.Volumes) && s.snap.Volumes[i].Name == name && !s.snap.Volumes[i].Tombstoned
	}
	return false
}

// liveNames lists the names of the live VMs and volumes, sorted.
func (s *hostSnapshot) liveNames() (vms, vols []string) {
	for _, vm := range s.snap.VMs {
		if !vm.Tombstoned {
			vms = append(vms, vm.Name)
		}
	}
	for _, v := range s.snap.Volumes {
		if !v.Tombstoned {
			vols = append(vols, v.Name)
		}
	}
	return vms, vols
}

// buildSnapshots computes, for every host of the fleet or with a pending
// tombstone, its snapshot without epoch and source: live VMs and volumes and
// the tombstoned ones, sorted by name; a Host with nothing on it gets an
// empty snapshot (a real, empty desired state). It is the one builder of
// snapshots. It takes spec hashes from specHash, which caches them across
// passes, and copies the live specs only withSpecs: a pass over ten
// thousand VMs must neither re-encode nor copy ten thousand specs to find
// the one host that changed.
func buildSnapshots(f *desired.Fleet, tombs []*snapshots.TombstoneRecord, specHash func(*desired.VM) desired.Hash, withSpecs bool) map[string]*hostSnapshot {
	out := make(map[string]*hostSnapshot, len(f.Hosts))
	// Each host's list sized up front: appending ten thousand entries of
	// a full VM spec each, doubling as it goes, was most of a pass's
	// allocation.
	vmsOn := make(map[string]int, len(f.Hosts))
	for _, vm := range f.VMs {
		vmsOn[vm.Spec.Host]++
	}
	get := func(host string) *hostSnapshot {
		s := out[host]
		if s == nil {
			s = &hostSnapshot{snap: &snapshots.Snapshot{Host: host, VMs: make([]snapshots.SnapshotVM, 0, vmsOn[host]), Volumes: []snapshots.SnapshotVolume{}}}
			out[host] = s
		}
		return s
	}
	for name, h := range f.Hosts {
		get(name).snap.HostSpec = h.Spec
	}
	for name, r := range f.BackupRepositories {
		for _, h := range r.Spec.Hosts {
			s := get(h)
			s.snap.BackupRepositories = append(s.snap.BackupRepositories,
				snapshots.SnapshotBackupRepository{Name: name, URL: r.Spec.URL, Maintenance: r.Spec.Maintenance == h})
		}
	}
	for name, vm := range f.VMs {
		s := get(vm.Spec.Host)
		e := snapshots.SnapshotVM{Name: name, SpecHash: specHash(vm)}
		if withSpecs {
			e.Spec = vm.Spec
		}
		s.snap.VMs = append(s.snap.VMs, e)
	}
	for name, v := range f.Volumes {
		s := get(v.Spec.Host)
		s.snap.Volumes = append(s.snap.Volumes, snapshots.SnapshotVolume{Name: name, SizeGB: v.Spec.SizeGB})
	}
	for _, s := range out {
		sortEntries(s)
	}
	addTombstones(out, tombs)
	return out
}

// addTombstones adds the tombstoned entries to the hosts' snapshots, with
// their last specs, keeping the lists sorted.
func addTombstones(out map[string]*hostSnapshot, tombs []*snapshots.TombstoneRecord) {
	touched := map[*hostSnapshot]bool{}
	for _, t := range tombs {
		s := out[t.Host]
		if s == nil {
			s = &hostSnapshot{snap: &snapshots.Snapshot{Host: t.Host, VMs: []snapshots.SnapshotVM{}, Volumes: []snapshots.SnapshotVolume{}}}
			out[t.Host] = s
		}
		touched[s] = true
		s.tombs = append(s.tombs, t)
		tb := t.Tombstone
		switch t.Kind {
		case desired.KindVM:
			vm := snapshots.SnapshotVM{Name: t.Name, Tombstoned: true, Tombstone: &tb}
			if t.Spec != nil {
				vm.Spec = *t.Spec
			}
			vm.SpecHash = desired.SpecHash(vm.Spec)
			s.snap.VMs = append(s.snap.VMs, vm)
		case desired.KindVolume:
			s.snap.Volumes = append(s.snap.Volumes, snapshots.SnapshotVolume{Name: t.Name, SizeGB: t.SizeGB, Tombstoned: true, Tombstone: &tb})
		}
	}
	for s := range touched {
		sortEntries(s)
	}
}

func sortEntries(s *hostSnapshot) {
	slices.SortFunc(s.snap.VMs, func(a, b snapshots.SnapshotVM) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(s.snap.Volumes, func(a, b snapshots.SnapshotVolume) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(s.snap.BackupRepositories, func(a, b snapshots.SnapshotBackupRepository) int { return strings.Compare(a.Name, b.Name) })
}

// contentKey identifies a snapshot's content without its epoch, its source
// and its tombstones' epochs (fixed once published): two snapshots with the
// same key need no new epoch. VM specs enter through their spec hashes.
func contentKey(s *snapshots.Snapshot) desired.Hash {
	h := sha256.New()
	hs, _ := json.Marshal(s.HostSpec)
	h.Write(hs)
	tomb := func(w io.Writer, t *snapshots.Tombstone) {
		if t == nil {
			io.WriteString(w, "\x00-")
			return
		}
		fmt.Fprintf(w, "\x00%s\x00%s\x00%s\x00%t", t.Commit, t.Author, t.Time, t.Rewritten)
		if t.Confirm != "" {
			// Only when set: the keys of snapshots published before
			// confirmations existed stay what they were.
			io.WriteString(w, "\x00confirm\x00"+t.Confirm)
		}
	}
	for _, vm := range s.VMs {
		io.WriteString(h, "\x01vm\x00"+vm.Name+"\x00"+string(vm.SpecHash)+"\x00"+strconv.FormatBool(vm.Tombstoned))
		tomb(h, vm.Tombstone)
	}
	for _, v := range s.Volumes {
		io.WriteString(h, "\x01vol\x00"+v.Name+"\x00"+strconv.Itoa(v.SizeGB)+"\x00"+strconv.FormatBool(v.Tombstoned))
		tomb(h, v.Tombstone)
	}
	for _, r := range s.BackupRepositories {
		// Only when there are some: the keys of snapshots published
		// before repositories existed stay what they were.
		fmt.Fprintf(h, "\x01repo\x00%s\x00%s\x00%t", r.Name, r.URL, r.Maintenance)
	}
	// 64 bits tell content apart as well as 256 here, at a quarter of the
	// ledger's bytes.
	return desired.Hash(hex.EncodeToString(h.Sum(nil)[:8]))
}

// ref is an object on a host: the unit tombstones are kept for.
type ref = snapshots.Ref
