package status

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/internal/redact"
)

// Summary is what the controller renders into README.md on the status branch
// (docs/DESIGN.md, Controller semantics 7). It holds no clock reading of its own:
// rendering the same Summary twice gives the same bytes, so the file is
// rewritten only when the fleet changed.
type Summary struct {
	// Branch and Applied name the desired-state branch and the commit whose
	// state the snapshots carry; Applied is empty before the first publish.
	Branch  string
	Applied desired.Hash
	Hosts   []HostSummary
	Pending []PendingDelete
	// ForgedAcks are acks the controller did not act on: the host's
	// status commit is not signed by its Host's spec.agentKey. Their
	// deletes stay pending.
	ForgedAcks []ForgedAck
	// ForgedCommits are the commits the controller found on the snapshots
	// branch above the newest one a controller key signed (the ledger's
	// record, at most 50, oldest first): never acted on, written over.
	ForgedCommits []ForgedCommit
	// Swept are the most recent deletes the controller finalized itself for
	// hosts that were offline, newest last.
	Swept []SweptDelete
	// Rejected is the last desired-state commit that was refused, if any.
	Rejected *Rejection
	// Failing is why the controller's passes are not acting now, when git
	// failed or the controller refused (not the commit's fault); nil while
	// passes succeed.
	Failing *PassFailure
	// Retained are objects a history rewrite dropped from the desired
	// state, kept running instead of deleted.
	Retained []RetainedObject
	// Unmanaged are VMs a host reports that neither the desired state nor
	// the controller's ledger knows (a repository restored from a backup
	// that lacks them, say); the agents keep them.
	Unmanaged []UnmanagedVM
	// AbandonGrace is the controller's abandon grace, stated with each
	// pending delete's sweep deadline.
	AbandonGrace time.Duration
	// ViewAt is the controller's clock at the pass that made this
	// summary. While passes fail (Failing), the controller writes its
	// last good summary again, and the README says the hosts and VMs it
	// lists are as of ViewAt: the time the README was written is not the
	// time of that view.
	ViewAt time.Time
}

// RetainedObject is an object kept after a history rewrite: Commit is the
// rewriting head, Since the controller's clock when it was first kept.
type RetainedObject struct {
	Kind   string
	Name   string
	Host   string
	Commit desired.Hash
	Since  time.Time
}

// UnmanagedVM is a VM on a host that the desired state does not declare and
// the controller never published there.
type UnmanagedVM struct {
	Name  string
	Host  string
	Phase string
	// Unsigned is HostSummary.Unsigned of its host (set for a host the
	// summary does not list, too): the VM is only the status' claim.
	Unsigned string
}

// HostSummary is one host's line. Online is judged by the controller's own
// clock from changes of the host's status file. Epoch is the last snapshot
// epoch published for the host; LastSeenEpoch the last one its agent
// accepted. VMs are as the host's status reports them.
type HostSummary struct {
	Name     string
	Online   bool
	Reported bool // a status file exists
	// StatusError says why the host's status file could not be read.
	StatusError string
	Heartbeat   uint64
	// LastStatus is the observedAt of the host's status (the agent's
	// clock); shown only for an offline host (NoStatusSince), so the
	// summary changes with it only when it says something.
	LastStatus     time.Time
	Accel          string
	AgentVersion   string
	Epoch          uint64
	LastSeenEpoch  uint64
	FenceViolation bool
	// SnapshotError is why the host's agent refuses the snapshot on the
	// branch (its status' snapshotError): not signed by the controller,
	// unparsable, fenced.
	SnapshotError string
	VMs           []VM
	// Quarantined are the host's tombstoned VMs shut down and waiting for
	// their grace; Suspended is set while the host's reconciliation is
	// suspended. Both as its status reports them.
	Quarantined []Quarantine
	Suspended   *Suspension
	// QuarantinedVolumes are the host's tombstoned volumes waiting for
	// their grace, as its status reports them.
	QuarantinedVolumes []Quarantine
	// Unconfirmed counts the host's quarantined objects whose delete waits
	// for a confirmation the controller has not published: the host
	// quarantined them for a tombstone the controller does not hold
	// pending (an old snapshot pushed back to the branch), or it has not
	// read the host's nonce yet. They are not destroyed until it does.
	Unconfirmed int
	// Retired is set for a host the applied desired state has no Host
	// object for, listed while deletes delivered to it wait for its ack.
	Retired bool
	// Unsigned says why the host's status commit is not signed by its
	// Host's spec.agentKey ("" when it is, or the Host names none): what
	// the status reports is unverified, and none of it is acted on.
	Unsigned string
	// Networks are the host's networks as its status reports them; a
	// degraded one is named in the host's state.
	Networks []NetworkHealth
}

// PendingDelete is a tombstone not finalized yet: who removed what, with
// which commit, and since when. Time is the removing commit's author time;
// Rewritten flags a removal attributed to a rewritten history's new head
// (the controller retains what a rewrite dropped instead, see
// Summary.Retained; docs/DESIGN.md, Refinements).
type PendingDelete struct {
	Kind      string
	Name      string
	Host      string
	Commit    desired.Hash
	Author    string
	Time      time.Time
	Epoch     uint64
	Rewritten bool
	// Swept: the controller finalized it while the host was offline; it
	// stays delivered until the host acks the destroy.
	Swept bool
	// DestroyAt is when the host destroys the VM or removes the volume
	// (its status' quarantine entry), zero until the host has quarantined
	// it. SweepAt is when the
	// controller finalizes the delete itself should the host be offline
	// then (published plus the abandon grace), zero once swept.
	DestroyAt time.Time
	SweepAt   time.Time
	// Unconfirmed is set while the host's quarantine of the object waits
	// for the controller to confirm the delete (Quarantine.AwaitsConfirmation).
	Unconfirmed bool
	// HostUnverified is set when the host's status commit is not signed
	// by its Host's agentKey (HostSummary.Unsigned): DestroyAt and
	// Unconfirmed are then not taken from it, and the deadline says the
	// host's progress is unknown.
	HostUnverified bool
}

// ForgedAck is an ack not acted on: Ref is the object ("VM web-01@hv-a"),
// Commit the host branch's status commit ("" when the status came from
// the status branch), Reason why it does not count.
type ForgedAck struct {
	Ref    string
	Commit desired.Hash
	Reason string
}

// ForgedCommit is a snapshots commit no controller key signed: Commit,
// Signed the signed commit below it whose ledger the controller read
// instead, Reason why it was refused, At when it was first found (the
// controller's clock).
type ForgedCommit struct {
	Commit desired.Hash
	Signed desired.Hash
	Reason string
	At     time.Time
}

// SweptDelete is a tombstone the controller finalized because its host was
// offline past the abandon grace.
type SweptDelete struct {
	Kind   string
	Name   string
	Host   string
	Commit desired.Hash
	At     time.Time
	Reason string
}

// Rejection is a desired-state commit (empty when the fetch itself failed)
// that was refused, and why. The last good snapshots stayed in place.
// SupersededBy is the commit applied since, empty while the rejection
// stands.
type Rejection struct {
	Commit       desired.Hash
	At           time.Time
	Reason       string
	SupersededBy desired.Hash
}

// summaryIntro opens every README after its title; StampSummary's
// paragraph follows it.
const summaryIntro = "This file is written by the gitfleet controller; each `hosts/<host>.yaml` beside it is the controller's copy of a host's status, which the host's agent writes to its own branch.\n\n"

// writtenLine is the README's paragraph on when it was written.
func writtenLine(w LastWrite) string {
	return fmt.Sprintf("Written at %s. The controller rewrites this branch at least every %s: a time older than %s means what follows is not its current view (it has stopped, or its passes fail: see `controller.yaml`).\n\n",
		stamp(w.At.Truncate(time.Second)), w.Refresh(), StaleRefreshes*w.Refresh())
}

// StampSummary adds to data, a RenderSummary, the paragraph that says
// when the controller wrote it (w, the last-write.yaml of the commit it
// goes in) and how old it may get before it is not the controller's
// current view (LastWrite.Stale), after the intro. RenderSummary leaves
// it out: the controller compares renders to tell a change, and the time
// alone is none. data without the intro is returned as it is.
func StampSummary(data []byte, w LastWrite) []byte {
	i := bytes.Index(data, []byte(summaryIntro))
	if i < 0 {
		return data
	}
	at := i + len(summaryIntro)
	line := writtenLine(w)
	out := make([]byte, 0, len(data)+len(line))
	return append(append(append(out, data[:at]...), line...), data[at:]...)
}

// RenderSummary renders s as the Markdown of README.md: the sections of
// summarySections, in order. Commits are shown by their first 12 hex
// digits; times in UTC, RFC 3339.
func RenderSummary(s Summary) []byte {
	var b bytes.Buffer
	for _, section := range summarySections {
		section(s, &b)
	}
	return b.Bytes()
}

// summarySections write the README's sections in the order a reader
// needs them: what the controller applied and whether its passes work,
// then the fleet (hosts, VMs, deletes), then what it refused to act on
// and what it kept or finalized on its own. Each writes nothing, or whole
// paragraphs ending in a blank line.
var summarySections = []func(Summary, *bytes.Buffer){
	Summary.writeTitle,
	Summary.writeFailing,
	Summary.writeRejected,
	Summary.writeHosts,
	Summary.writeVMs,
	Summary.writePending,
	Summary.writeForgedAcks,
	Summary.writeForgedCommits,
	Summary.writeRetained,
	Summary.writeUnmanaged,
	Summary.writeSwept,
}

// writeTitle writes the title, the intro and the desired branch with the
// commit applied.
func (s Summary) writeTitle(b *bytes.Buffer) {
	b.WriteString("# gitfleet status\n\n")
	b.WriteString(summaryIntro)
	branch := s.Branch
	if branch == "" {
		branch = "main"
	}
	if s.Applied != "" {
		fmt.Fprintf(b, "Desired state: `%s` at `%s`.\n\n", branch, s.Applied.Short())
	} else {
		fmt.Fprintf(b, "Desired state: `%s`, nothing applied yet.\n\n", branch)
	}
}

// writeFailing says, while passes fail, since when and why, and that
// what follows is as of the last good pass.
func (s Summary) writeFailing(b *bytes.Buffer) {
	f := s.Failing
	if f == nil {
		return
	}
	b.WriteString("## Controller passes failing\n\n")
	why := "`unreadable`: git failed, nothing is said about the desired commit"
	if f.Outcome == FailureRefused {
		why = "`refused`: the controller will not act on what it read"
	}
	fmt.Fprintf(b, "Since %s every pass is %s; the last good snapshots stay in place, and passes are retried with back-off.", stamp(f.Since), why)
	if !s.ViewAt.IsZero() {
		fmt.Fprintf(b, " Hosts, VMs and deletes below are as of %s, the last pass that succeeded: not what they are now.", stamp(s.ViewAt))
	}
	b.WriteString("\n\n")
	codeBlock(b, f.Reason)
}

// writeRejected writes the last rejected desired commit and whether a
// later one has been applied since.
func (s Summary) writeRejected(b *bytes.Buffer) {
	r := s.Rejected
	if r == nil {
		return
	}
	b.WriteString("## Last rejected commit\n\n")
	commit := "(no commit: the desired branch could not be read)"
	if r.Commit != "" {
		commit = "`" + r.Commit.Short() + "`"
	}
	if r.SupersededBy != "" {
		fmt.Fprintf(b, "%s at %s was rejected; `%s` has been applied since.\n\n", commit, stamp(r.At), r.SupersededBy.Short())
	} else {
		fmt.Fprintf(b, "%s at %s was rejected; the last good snapshots stay in place.\n\n", commit, stamp(r.At))
	}
	codeBlock(b, r.Reason)
}

// writeHosts writes the table of hosts, one row each.
func (s Summary) writeHosts(b *bytes.Buffer) {
	b.WriteString("## Hosts\n\n")
	if len(s.Hosts) == 0 {
		b.WriteString("No hosts.\n\n")
		return
	}
	tableHeader(b, "host", "state", "heartbeat", "accel", "agent", "epoch published", "epoch seen", "VMs")
	for _, h := range s.Hosts {
		fmt.Fprintf(b, "| %s | %s | %d | %s | %s | %d | %d | %d |\n",
			cell(h.Name), cell(h.stateCell()), h.Heartbeat, cell(h.Accel), cell(h.AgentVersion),
			h.Epoch, h.LastSeenEpoch, len(h.VMs))
	}
	b.WriteString("\n")
}

// stateCell is the host's state with everything that qualifies it: why
// its status is unreadable or unverified, a refused snapshot, deletes
// waiting for confirmation, a suspension.
func (h HostSummary) stateCell() string {
	state := h.State()
	if h.StatusError != "" {
		state += ": " + h.StatusError
	}
	if state == StateOffline && !h.LastStatus.IsZero() {
		state += ": " + NoStatusSince(h.LastStatus)
	}
	if h.Retired {
		state += ", " + RetiredNote
	}
	if h.Unsigned != "" {
		state += ", " + UnsignedNote + ": " + h.Unsigned
	}
	switch {
	case h.FenceViolation:
		state += ", fence violation"
	case h.SnapshotError != "":
		state += ", snapshot refused: " + strings.TrimPrefix(h.SnapshotError, "snapshot refused: ")
	}
	if h.Unconfirmed > 0 {
		state += fmt.Sprintf(", %d quarantined, waiting for the controller to confirm the delete", h.Unconfirmed)
	}
	for _, n := range h.Networks {
		if note := DegradedNote(n); note != "" {
			state += ", " + note
		}
	}
	if h.Suspended != nil {
		state += ", suspended (acts on nothing)"
		if h.Suspended.Reason != "" {
			state += ": " + h.Suspended.Reason
		}
	}
	return state
}

// writeVMs writes the table of VMs the hosts report, running or
// quarantined.
func (s Summary) writeVMs(b *bytes.Buffer) {
	b.WriteString("## VMs\n\n")
	n := 0
	for _, h := range s.Hosts {
		n += len(h.VMs) + len(h.Quarantined)
	}
	if n == 0 {
		b.WriteString("No VMs reported.\n\n")
		return
	}
	b.WriteString("A running VM is `booting` until its guest answers (an SSH banner, a qemu-guest-agent ping or its console's ready line; a VM given SSH keys only while its sshd answers), then `ready`.\n\n")
	tableHeader(b, "VM", "host", "phase", "power", "address", "error", "note")
	for _, h := range s.Hosts {
		hostNote := VMHostNote(h.State(), h.Suspended != nil)
		if h.Unsigned != "" {
			hostNote = JoinNotes(UnsignedNote, hostNote)
		}
		for _, vm := range h.VMs {
			fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s |\n",
				cell(vm.Name), cell(h.Name), cell(vm.Phase), cell(vm.Power), cell(vm.addressCell()), cell(vm.LastError), cell(JoinNotes(vm.Message, hostNote)))
		}
		for _, q := range h.Quarantined {
			fmt.Fprintf(b, "| %s | %s | %s | stopped | - | %s | %s |\n",
				cell(q.Name), cell(h.Name), PhaseQuarantined, cell(q.LastError), cell(QuarantineNote(q)))
		}
	}
	b.WriteString("\n")
}

// addressCell is the VM's IP address and its SSH endpoint, either
// or both.
func (vm VM) addressCell() string {
	addr := vm.IP
	if vm.SSH != "" {
		if addr != "" {
			addr += ", "
		}
		addr += "ssh " + vm.SSH
	}
	return addr
}

// writePending writes the table of deletes not finalized yet.
func (s Summary) writePending(b *bytes.Buffer) {
	b.WriteString("## Pending deletes\n\n")
	if len(s.Pending) == 0 {
		b.WriteString("None.\n\n")
		return
	}
	tableHeader(b, "kind", "name", "host", "removed by", "author", "since", "epoch", "deadline")
	for _, p := range s.Pending {
		by := "`" + p.Commit.Short() + "`"
		if p.Rewritten {
			by += " (history rewritten)"
		}
		if p.Swept {
			by += " (swept while the host was offline; waits for its ack)"
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %d | %s |\n",
			cell(p.Kind), cell(p.Name), cell(p.Host), by, cell(p.Author), stamp(p.Time), p.Epoch, cell(p.Deadline(s.AbandonGrace)))
	}
	b.WriteString("\n")
}

// writeForgedAcks writes the acks not acted on, if any.
func (s Summary) writeForgedAcks(b *bytes.Buffer) {
	if len(s.ForgedAcks) == 0 {
		return
	}
	b.WriteString("## Forged acks\n\n")
	b.WriteString("These acks were not acted on: the status commit is not signed by the key the Host's spec.agentKey names. The deletes stay pending until the host's own agent acks them with a signed status (check who can push to the host's branch).\n\n")
	tableHeader(b, "object", "status commit", "reason")
	for _, f := range s.ForgedAcks {
		fmt.Fprintf(b, "| %s | %s | %s |\n", cell(f.Ref), commitCell(f.Commit), cell(f.Reason))
	}
	b.WriteString("\n")
}

// writeForgedCommits writes the snapshots commits no controller key
// signed, if any.
func (s Summary) writeForgedCommits(b *bytes.Buffer) {
	if len(s.ForgedCommits) == 0 {
		return
	}
	b.WriteString("## Forged snapshots commits\n\n")
	b.WriteString("These commits on the snapshots branch are not signed by a controller key: the controller never acted on their ledger or files, read the ledger of the signed commit below them instead, and wrote its next commit over them, republishing every host file that differed. A row without a signed commit is a ledger record a controller without a signing key did not act on (a retained object the desired history does not justify, a name the applied commit never held, a tombstone no desired commit made). Check who can push to the snapshots branch (docs/operating.md, \"Forged snapshots commits\").\n\n")
	tableHeader(b, "commit", "signed commit read instead", "found", "reason")
	for _, f := range s.ForgedCommits {
		fmt.Fprintf(b, "| `%s` | %s | %s | %s |\n", f.Commit.Short(), commitCell(f.Signed), stamp(f.At), cell(f.Reason))
	}
	b.WriteString("\n")
}

// writeRetained writes the objects kept after a history rewrite, if any.
func (s Summary) writeRetained(b *bytes.Buffer) {
	if len(s.Retained) == 0 {
		return
	}
	b.WriteString("## Kept after a history rewrite\n\n")
	b.WriteString("These objects left the desired state through a rewritten history (a force-push, a reset), not a reviewed delete: they keep running with their last spec. Restore the file, or re-add and delete it in a reviewed commit.\n\n")
	tableHeader(b, "kind", "name", "host", "state", "since")
	for _, k := range s.Retained {
		fmt.Fprintf(b, "| %s | %s | %s | kept after a history rewrite at `%s`: restore the file, or re-add and delete it in a reviewed commit | %s |\n",
			cell(k.Kind), cell(k.Name), cell(k.Host), k.Commit.Short(), stamp(k.Since))
	}
	b.WriteString("\n")
}

// writeUnmanaged writes the VMs on hosts that the desired state does not
// know, if any.
func (s Summary) writeUnmanaged(b *bytes.Buffer) {
	if len(s.Unmanaged) == 0 {
		return
	}
	b.WriteString("## On hosts, not in the desired state\n\n")
	tableHeader(b, "VM", "host", "phase", "state")
	for _, u := range s.Unmanaged {
		state := "on host, not in the desired state: kept"
		if u.Unsigned != "" {
			state = JoinNotes(state, UnsignedNote)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", cell(u.Name), cell(u.Host), cell(u.Phase), state)
	}
	b.WriteString("\n")
}

// writeSwept writes the deletes the controller finalized for offline
// hosts, if any.
func (s Summary) writeSwept(b *bytes.Buffer) {
	if len(s.Swept) == 0 {
		return
	}
	b.WriteString("## Deletes finalized for offline hosts\n\n")
	tableHeader(b, "kind", "name", "host", "removed by", "finalized", "reason")
	for _, w := range s.Swept {
		fmt.Fprintf(b, "| %s | %s | %s | `%s` | %s | %s |\n",
			cell(w.Kind), cell(w.Name), cell(w.Host), w.Commit.Short(), stamp(w.At), cell(w.Reason))
	}
	b.WriteString("\n")
}

// commitCell is a commit by its short hash in code, "-" for none.
func commitCell(h desired.Hash) string {
	if h == "" {
		return "-"
	}
	return "`" + h.Short() + "`"
}

// QuarantineNote says, for a person, what happens to a quarantined VM and
// when: "pending delete: shut down since T, destroyed at D (grace G)".
//
// An object waiting for the controller's confirmation says so: "…;
// waiting for the controller to confirm the delete (nonce N): not
// destroyed until it does".
func QuarantineNote(q Quarantine) string {
	note := "pending delete: shut down since " + stamp(q.Since)
	if q.DestroyAt.IsZero() {
		note += ", destroyed after the host's tombstone grace"
	} else {
		note = fmt.Sprintf("%s, destroyed at %s (tombstone grace %s)", note, stamp(q.DestroyAt), q.DestroyAt.Sub(q.Since))
	}
	if q.AwaitsConfirmation() {
		note += "; " + AwaitingConfirmation(q.Confirm)
	}
	return note
}

// AwaitingConfirmation is what a person reads about a quarantined object
// whose host waits for the controller to confirm its delete (nonce is
// the quarantine's Confirm).
func AwaitingConfirmation(nonce string) string {
	return fmt.Sprintf("waiting for the controller to confirm the delete (nonce %.8s): not destroyed until a snapshot it publishes carries the nonce", nonce)
}

// Deadline says when the pending delete happens: the host's destroy time
// once it has shut the VM down, else after its grace from then; and when
// the controller sweeps it should the host be offline, with abandonGrace.
func (p PendingDelete) Deadline(abandonGrace time.Duration) string {
	var d string
	switch {
	case p.HostUnverified:
		d = "unknown: the host's status is not signed by its agentKey, so what it says of this delete is not read"
	case !p.DestroyAt.IsZero() && p.Kind == "VM":
		d = "host destroys it at " + stamp(p.DestroyAt)
	case !p.DestroyAt.IsZero():
		d = "host removes it at " + stamp(p.DestroyAt) + ", once no VM uses it"
	case p.Kind == "VM":
		d = "not shut down yet: the host destroys it one tombstone grace after it does"
	default:
		d = "the host removes it one tombstone grace after no VM uses it"
	}
	if p.Unconfirmed {
		d += "; the host waits for the controller to confirm the delete"
	}
	if !p.SweepAt.IsZero() && !p.Swept {
		d += fmt.Sprintf("; if the host is offline then, the controller finalizes it at %s (abandon grace %s)", stamp(p.SweepAt), abandonGrace)
	}
	return d
}

// BackupNote is a VM's backup state in one line, for the VM tables:
// the last success (backup id, when, consistency, bytes added), when the
// next is due, and the last failure; "" for a VM without a backup policy.
func BackupNote(b *Backup) string {
	if b == nil {
		return ""
	}
	note := "backup to " + b.Repository + ": none yet"
	if !b.LastSuccess.IsZero() {
		note = fmt.Sprintf("backup to %s: %s at %s (%s, %d bytes added)", b.Repository, b.LastBackupID, stamp(b.LastSuccess), b.Consistency, b.BytesAdded)
	}
	if !b.NextDue.IsZero() {
		note += ", next due " + stamp(b.NextDue)
	}
	if b.LastError != "" {
		note += "; last failure: " + b.LastError
	}
	return note
}

// JoinNotes joins the non-empty notes with "; ": a row's notes, in the
// README and in `gitfleet status` alike.
func JoinNotes(notes ...string) string {
	var out []string
	for _, n := range notes {
		if n != "" {
			out = append(out, n)
		}
	}
	return strings.Join(out, "; ")
}

// tableHeader writes a Markdown table's header row and its separator.
func tableHeader(b *bytes.Buffer, columns ...string) {
	b.WriteString("| " + strings.Join(columns, " | ") + " |\n")
	b.WriteString(strings.Repeat("|---", len(columns)) + "|\n")
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// maxCell is the most characters of one value a summary cell shows: an
// error of any length never makes the README large.
const maxCell = 500

// cell makes s safe inside one Markdown table cell: credentials in URLs
// are redacted (see internal/redact), line breaks become spaces, and every
// character Markdown or HTML gives a meaning to is escaped, so text from an
// agent's status or a commit renders as the text it is: no link, image,
// emphasis, HTML tag, entity or autolink.
func cell(s string) string {
	if s == "" {
		return "-"
	}
	s = redact.Text(s)
	if r := []rune(s); len(r) > maxCell {
		s = string(r[:maxCell]) + "…"
	}
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '\r':
		case '\n':
			b.WriteByte(' ')
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		case '&':
			b.WriteString("&amp;")
		case '\\', '`', '*', '_', '{', '}', '[', ']', '(', ')', '#', '+', '!', '|', '~', ':', '@', '$':
			b.WriteByte('\\')
			b.WriteRune(r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// codeBlock writes text as a fenced block that no text can close early.
func codeBlock(b *bytes.Buffer, text string) {
	b.WriteString("```\n")
	b.WriteString(strings.TrimRight(strings.ReplaceAll(redact.Text(text), "```", "'''"), "\n"))
	b.WriteString("\n```\n\n")
}
