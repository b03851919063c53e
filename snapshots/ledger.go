package snapshots

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/gitfleet/gitfleet/desired"
)

// LedgerPath is the controller's state on the snapshots branch.
const LedgerPath = "ledger.yaml"

// ledgerVersion is the format of ledger.yaml this release writes and reads.
const ledgerVersion = 1

// MaxSweeps bounds the sweep records kept in the ledger (newest kept).
const MaxSweeps = 100

// Ledger is the controller's memory, ledger.yaml on the snapshots branch. It
// holds only what a pass needs to recover after a restart, and is rewritten
// in the same commit as the host snapshots it describes, so the two never
// disagree.
type Ledger struct {
	Version int `yaml:"version" json:"version"`
	// Applied is the last desired-state commit whose snapshots were
	// published; nil before the first publish.
	Applied *AppliedCommit `yaml:"applied,omitempty" json:"applied,omitempty"`
	// Rejected is the last desired-state commit that was refused (or a fetch
	// that failed, with an empty commit).
	Rejected *Rejection `yaml:"rejected,omitempty" json:"rejected,omitempty"`
	// Hosts is per host: its epoch and the identities it held in Applied.
	Hosts map[string]*HostRecord `yaml:"hosts" json:"hosts"`
	// Tombstones are the pending deletes, sorted by host, kind and name.
	Tombstones []*TombstoneRecord `yaml:"tombstones" json:"tombstones"`
	// Sweeps are the last deletes the controller finalized itself because
	// the host was offline, oldest first, at most 100.
	Sweeps []SweepRecord `yaml:"sweeps,omitempty" json:"sweeps,omitempty"`
	// Retained are the objects a history rewrite dropped from the desired
	// state (the applied commit is not an ancestor of the new head): kept
	// live in their host's snapshot with their last spec, never
	// tombstoned, sorted by host, kind and name. One leaves the list when
	// it is desired on its host again; deleting it takes a reviewed delete
	// (add the file back, then delete it).
	Retained []*RetainedRecord `yaml:"retained,omitempty" json:"retained,omitempty"`
	// ForgedAcks are the acks the last pass did not act on: the host's
	// status commit is not signed by the key its Host's spec.agentKey
	// names. Their deletes stay pending. Recomputed by every pass.
	ForgedAcks []ForgedAckRecord `yaml:"forgedAcks,omitempty" json:"forgedAcks,omitempty"`
	// ForgedCommits are the last commits found on the snapshots branch
	// above the newest one a controller key signed (written by someone
	// else, and never read by the controller), oldest first, at most
	// MaxForgedCommits.
	ForgedCommits []ForgedCommitRecord `yaml:"forgedCommits,omitempty" json:"forgedCommits,omitempty"`
	// Adopted is the unsigned snapshots commit whose ledger a controller
	// with a signing key adopted once (--trust-unsigned-ledger-once), and
	// when (its clock); nil when none was.
	Adopted *Adoption `yaml:"adopted,omitempty" json:"adopted,omitempty"`
	// SignaturesSeen are the desired-state commits whose signature the
	// controller checks (the applied commit, and in every mode those
	// above it), each with when it first saw it (its clock): a key's
	// validity is judged then, never at a commit date its signer writes
	// (docs/DESIGN.md, "Signed desired state"). A controller acts on them
	// only in a ledger a controller key signed. At most MaxSignaturesSeen,
	// sorted by commit.
	SignaturesSeen []SeenCommit `yaml:"signaturesSeen,omitempty" json:"signaturesSeen,omitempty"`
}

// SeenCommit is a commit and when a controller first saw it.
type SeenCommit struct {
	Commit desired.Hash `yaml:"commit" json:"commit"`
	At     time.Time    `yaml:"at" json:"at"`
}

// MaxSignaturesSeen bounds Ledger.SignaturesSeen: the applied commit and
// the 1,000 first-parent commits above it a controller verifies at most.
const MaxSignaturesSeen = 1001

// Adoption is an unsigned ledger adopted by a controller that signs.
type Adoption struct {
	Commit desired.Hash `yaml:"commit" json:"commit"`
	At     time.Time    `yaml:"at" json:"at"`
}

// MaxForgedCommits bounds the forged snapshots commits kept in the ledger
// (newest kept).
const MaxForgedCommits = 50

// ForgedAckRecord is an ack not acted on: Ref is the object ("VM
// web-01@hv-a"), Commit the host's status commit ("" when the status came
// from the status branch), Reason why it does not count.
type ForgedAckRecord struct {
	Ref    string       `yaml:"ref" json:"ref"`
	Commit desired.Hash `yaml:"commit,omitempty" json:"commit,omitempty"`
	Reason string       `yaml:"reason" json:"reason"`
}

// ForgedCommitRecord is a commit on the snapshots branch that no
// controller key signed: Commit, Signed the newest signed commit below it
// (the one whose ledger was read instead), Reason why it was refused and
// At, the controller's clock when it was first found.
type ForgedCommitRecord struct {
	Commit desired.Hash `yaml:"commit" json:"commit"`
	Signed desired.Hash `yaml:"signed,omitempty" json:"signed,omitempty"`
	Reason string       `yaml:"reason" json:"reason"`
	At     time.Time    `yaml:"at" json:"at"`
}

// RetainedRecord is an object kept after a history rewrite: its last spec
// (VM) or size in GB (Volume), the rewriting head commit (Commit), Since,
// the controller's clock when it was first kept, and From, where it was
// last desired.
type RetainedRecord struct {
	Kind   desired.Kind    `yaml:"kind" json:"kind"`
	Name   string          `yaml:"name" json:"name"`
	Host   string          `yaml:"host" json:"host"`
	Spec   *desired.VMSpec `yaml:"spec,omitempty" json:"spec,omitempty"`
	SizeGB int             `yaml:"sizeGB,omitempty" json:"sizeGB,omitempty"`
	Commit desired.Hash    `yaml:"commit" json:"commit"`
	Since  time.Time       `yaml:"since" json:"since"`
	// From is the applied commit the object was last desired at, before
	// the rewrite: a controller without a signing key publishes the
	// record only while that commit, read from the desired branch's
	// repository, holds the object on Host with this spec or size.
	From desired.Hash `yaml:"from,omitempty" json:"from,omitempty"`
}

// Ref is the object r keeps.
func (r *RetainedRecord) Ref() Ref { return Ref{Kind: r.Kind, Name: r.Name, Host: r.Host} }

// AppliedCommit names a desired-state commit, the branch it was read from
// and the objects' directory in its tree (Path, "" for the root; nil is
// read as "any path", see docs/DESIGN.md, Refinements). A
// controller configured with another branch or path refuses to publish over
// this ledger (ErrLedgerMismatch): its desired state would read as deleting
// everything the other one applied.
type AppliedCommit struct {
	Commit desired.Hash `yaml:"commit" json:"commit"`
	Branch string       `yaml:"branch" json:"branch"`
	Path   *string      `yaml:"path,omitempty" json:"path,omitempty"`
}

// Rejection is a refused desired-state commit and why. At is the
// controller's clock when it was first refused; Superseded is the commit
// applied after it, empty while the rejection stands. Commit is omitted
// when no commit could be read (a failed fetch, a missing branch): Reason
// says why.
type Rejection struct {
	Commit     desired.Hash `yaml:"commit,omitempty" json:"commit,omitempty"`
	Reason     string       `yaml:"reason" json:"reason"`
	At         time.Time    `yaml:"at" json:"at"`
	Superseded desired.Hash `yaml:"superseded,omitempty" json:"superseded,omitempty"`
}

// HostRecord is one host's line in the ledger. Epoch is the last epoch
// published for the host (never reused, even after the host's file is
// removed). Hash identifies the content of the published snapshot without
// its epoch and source (empty when no file is published, or after a fence
// jump to force a republish). VMs and Volumes are the names the host held in
// the applied desired state, sorted: the base tombstones are derived from.
// File is the SHA-256 (first 16 hex digits) of the bytes of the published
// hosts/<host>.yaml, for a person reading the ledger: the controller decides
// whether the file on the branch is genuine by rendering the snapshot
// afresh, never by this record, which is forged as easily as the file.
// AgentKey is the host's last known spec.agentKey (an authorized_keys
// line): kept after the Host object left the desired state, so the acks
// of its pending deletes are still verified against it.
type HostRecord struct {
	Epoch    uint64       `yaml:"epoch" json:"epoch"`
	Hash     desired.Hash `yaml:"hash,omitempty" json:"hash,omitempty"`
	File     desired.Hash `yaml:"file,omitempty" json:"file,omitempty"`
	VMs      []string     `yaml:"vms,flow,omitempty" json:"vms,omitempty"`
	Volumes  []string     `yaml:"volumes,flow,omitempty" json:"volumes,omitempty"`
	AgentKey string       `yaml:"agentKey,omitempty" json:"agentKey,omitempty"`
}

// TombstoneRecord is one pending delete: the object's last spec (VM) or size
// (Volume), its attribution, and PublishedAt, the controller's clock when
// the tombstone was first published (the abandon grace counts from it).
// Tombstone.Epoch is the epoch that first published it. SweptAt is set
// when the abandoned-host sweep finalized it (its host was offline past the
// abandon grace): the delete counts as done for the fleet, but the
// tombstone stays in the ledger and in its host's snapshot until that host
// acks the destroy, so a host that returns destroys it as a normal delete
// instead of finding a VM dropped without a tombstone.
type TombstoneRecord struct {
	Kind        desired.Kind    `yaml:"kind" json:"kind"`
	Name        string          `yaml:"name" json:"name"`
	Host        string          `yaml:"host" json:"host"`
	Spec        *desired.VMSpec `yaml:"spec,omitempty" json:"spec,omitempty"`
	SizeGB      int             `yaml:"sizeGB,omitempty" json:"sizeGB,omitempty"`
	Tombstone   Tombstone       `yaml:"tombstone" json:"tombstone"`
	PublishedAt time.Time       `yaml:"publishedAt" json:"publishedAt"`
	SweptAt     *time.Time      `yaml:"sweptAt,omitempty" json:"sweptAt,omitempty"`
}

// SweepRecord is a delete the controller finalized without an ack (its
// tombstone stays delivered until the host acks; see TombstoneRecord).
type SweepRecord struct {
	Kind   desired.Kind `yaml:"kind" json:"kind"`
	Name   string       `yaml:"name" json:"name"`
	Host   string       `yaml:"host" json:"host"`
	Commit desired.Hash `yaml:"commit" json:"commit"`
	At     time.Time    `yaml:"at" json:"at"`
	Reason string       `yaml:"reason" json:"reason"`
}

// Ref is an object on a host: the unit tombstones and retained objects are
// kept for.
type Ref struct {
	Kind desired.Kind
	Name string
	Host string
}

// Ref is the object t deletes.
func (t *TombstoneRecord) Ref() Ref { return Ref{Kind: t.Kind, Name: t.Name, Host: t.Host} }

// String is "Kind name on host", for messages.
func (r Ref) String() string { return fmt.Sprintf("%s %s on %s", r.Kind, r.Name, r.Host) }

// Key is "Kind name@host" ("VM web-01@hv-a"), as a ForgedAckRecord's Ref
// and the controller's reports name the object.
func (r Ref) Key() string { return fmt.Sprintf("%s %s@%s", r.Kind, r.Name, r.Host) }

// NewLedger is the ledger of a snapshots branch that has none yet.
func NewLedger() *Ledger {
	return &Ledger{Version: ledgerVersion, Hosts: map[string]*HostRecord{}}
}

// ledgerFormat is ledger.yaml in YAML's other styles, for desired.Decode.
// ParseLedger adds no size bound of its own, in either form: the readers
// bound what they read (64 MiB, docs/DESIGN.md).
var ledgerFormat = desired.Format{Noun: "ledger", Shape: "a mapping with version and hosts", MaxBytes: -1}

// ParseLedger decodes ledger.yaml strictly: an unknown version or field, or
// a tombstone or retained object without kind, name and host, is an error
// naming the file. A ledger that cannot be read stops the controller's
// pass: writing over it could reuse epochs. The controller writes the
// ledger in JSON, the subset of YAML that encodes ten thousand names in
// milliseconds, and reads it with encoding/json (unknown fields refused);
// a ledger that is not JSON (in YAML's other styles, edited by hand, say)
// is read with desired.Decode, the strict decoder of object files, whose
// errors give line, column and field.
func ParseLedger(data []byte) (*Ledger, error) {
	l := NewLedger()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(l); err != nil {
		var syn *json.SyntaxError
		if !errors.As(err, &syn) {
			return nil, fmt.Errorf("parse %s: %w", LedgerPath, err)
		}
		l = NewLedger()
		if err := desired.Decode("", data, l, ledgerFormat).Err(); err != nil {
			return nil, fmt.Errorf("parse %s: %w", LedgerPath, err)
		}
	}
	if l.Version != ledgerVersion {
		return nil, fmt.Errorf("parse %s: version %d, this controller reads version %d", LedgerPath, l.Version, ledgerVersion)
	}
	if l.Hosts == nil {
		l.Hosts = map[string]*HostRecord{}
	}
	for i, t := range l.Tombstones {
		if t == nil || t.Name == "" || t.Host == "" || (t.Kind != desired.KindVM && t.Kind != desired.KindVolume) {
			return nil, fmt.Errorf("parse %s: tombstones[%d]: needs kind VM or Volume, name and host", LedgerPath, i)
		}
	}
	for i, r := range l.Retained {
		if r == nil || r.Name == "" || r.Host == "" || (r.Kind != desired.KindVM && r.Kind != desired.KindVolume) {
			return nil, fmt.Errorf("parse %s: retained[%d]: needs kind VM or Volume, name and host", LedgerPath, i)
		}
	}
	if len(l.SignaturesSeen) > MaxSignaturesSeen {
		return nil, fmt.Errorf("parse %s: signaturesSeen: %d commits, more than the %d a controller writes", LedgerPath, len(l.SignaturesSeen), MaxSignaturesSeen)
	}
	return l, nil
}

// Marshal encodes the ledger as JSON (valid YAML) with one host, tombstone
// or sweep per line: compact for ten thousand names, and a change to one
// host is a one-line diff. Tombstones are sorted and map keys sorted, so
// equal ledgers give equal bytes.
func (l *Ledger) Marshal() ([]byte, error) {
	sortByRef(l.Tombstones)
	w := &ledgerWriter{}
	fmt.Fprintf(&w.b, "{\"version\": %d,\n", l.Version)
	if l.Applied != nil {
		w.b.WriteString("\"applied\": ")
		w.put(l.Applied)
		w.b.WriteString(",\n")
	}
	if l.Rejected != nil {
		w.b.WriteString("\"rejected\": ")
		w.put(l.Rejected)
		w.b.WriteString(",\n")
	}
	hosts := make([]string, 0, len(l.Hosts))
	for h := range l.Hosts {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	w.b.WriteString("\"hosts\": {")
	w.lines(len(hosts), func(i int) {
		w.put(hosts[i])
		w.b.WriteString(": ")
		w.put(l.Hosts[hosts[i]])
	})
	w.b.WriteString("},\n\"tombstones\": [")
	w.lines(len(l.Tombstones), func(i int) { w.put(l.Tombstones[i]) })
	w.b.WriteString("]")
	if len(l.Sweeps) > 0 {
		w.b.WriteString(",\n\"sweeps\": [")
		w.lines(len(l.Sweeps), func(i int) { w.put(l.Sweeps[i]) })
		w.b.WriteString("]")
	}
	if l.Adopted != nil {
		w.b.WriteString(",\n\"adopted\": ")
		w.put(l.Adopted)
	}
	if len(l.ForgedAcks) > 0 {
		w.b.WriteString(",\n\"forgedAcks\": [")
		w.lines(len(l.ForgedAcks), func(i int) { w.put(l.ForgedAcks[i]) })
		w.b.WriteString("]")
	}
	if len(l.ForgedCommits) > 0 {
		w.b.WriteString(",\n\"forgedCommits\": [")
		w.lines(len(l.ForgedCommits), func(i int) { w.put(l.ForgedCommits[i]) })
		w.b.WriteString("]")
	}
	if len(l.Retained) > 0 {
		sortByRef(l.Retained)
		w.b.WriteString(",\n\"retained\": [")
		w.lines(len(l.Retained), func(i int) { w.put(l.Retained[i]) })
		w.b.WriteString("]")
	}
	if len(l.SignaturesSeen) > 0 {
		sort.Slice(l.SignaturesSeen, func(i, j int) bool { return l.SignaturesSeen[i].Commit < l.SignaturesSeen[j].Commit })
		w.b.WriteString(",\n\"signaturesSeen\": [")
		w.lines(len(l.SignaturesSeen), func(i int) { w.put(l.SignaturesSeen[i]) })
		w.b.WriteString("]")
	}
	w.b.WriteString("}\n")
	if w.err != nil {
		return nil, w.err
	}
	return w.b.Bytes(), nil
}

// ledgerWriter builds the bytes of ledger.yaml and keeps the first error.
type ledgerWriter struct {
	b   bytes.Buffer
	err error
}

// put writes v as compact JSON.
func (w *ledgerWriter) put(v any) {
	if w.err != nil {
		return
	}
	data, err := json.Marshal(v)
	if err != nil {
		w.err = fmt.Errorf("marshal %s: %w", LedgerPath, err)
		return
	}
	w.b.Write(data)
}

// lines writes n items, each on its own indented line, comma-separated.
func (w *ledgerWriter) lines(n int, item func(i int)) {
	for i := range n {
		if i > 0 {
			w.b.WriteByte(',')
		}
		w.b.WriteString("\n  ")
		item(i)
	}
}

// sortByRef sorts records by host, kind and name.
func sortByRef[T interface{ Ref() Ref }](rs []T) {
	sort.Slice(rs, func(i, j int) bool {
		a, b := rs[i].Ref(), rs[j].Ref()
		if a.Host != b.Host {
			return a.Host < b.Host
		}
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		return a.Name < b.Name
	})
}

// Clone returns a deep copy a pass may modify. Specs of tombstones are
// shared: a pass never modifies a spec.
func (l *Ledger) Clone() *Ledger {
	c := *l
	if l.Applied != nil {
		a := *l.Applied
		if l.Applied.Path != nil {
			p := *l.Applied.Path
			a.Path = &p
		}
		c.Applied = &a
	}
	if l.Rejected != nil {
		r := *l.Rejected
		c.Rejected = &r
	}
	c.Hosts = make(map[string]*HostRecord, len(l.Hosts))
	for h, rec := range l.Hosts {
		r := *rec
		c.Hosts[h] = &r
	}
	c.Tombstones = make([]*TombstoneRecord, len(l.Tombstones))
	for i, t := range l.Tombstones {
		tt := *t
		c.Tombstones[i] = &tt
	}
	c.Sweeps = append([]SweepRecord(nil), l.Sweeps...)
	if l.Adopted != nil {
		a := *l.Adopted
		c.Adopted = &a
	}
	c.ForgedAcks = append([]ForgedAckRecord(nil), l.ForgedAcks...)
	c.ForgedCommits = append([]ForgedCommitRecord(nil), l.ForgedCommits...)
	c.SignaturesSeen = append([]SeenCommit(nil), l.SignaturesSeen...)
	c.Retained = make([]*RetainedRecord, len(l.Retained))
	for i, r := range l.Retained {
		rr := *r
		c.Retained[i] = &rr
	}
	return &c
}

// Host returns the record of host, creating it.
func (l *Ledger) Host(name string) *HostRecord {
	rec := l.Hosts[name]
	if rec == nil {
		rec = &HostRecord{}
		l.Hosts[name] = rec
	}
	return rec
}

// AppliedHash is the last desired-state commit the controller applied
// (applied.commit), or "" when there is none; a nil ledger has none.
func (l *Ledger) AppliedHash() desired.Hash {
	if l == nil || l.Applied == nil {
		return ""
	}
	return l.Applied.Commit
}
