package fleet

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gitfleet/gitfleet/desired"
)

// LedgerPath is the controller's state on the snapshots branch.
const LedgerPath = "ledger.yaml"

// ledgerVersion is the format of ledger.yaml this release writes and reads.
const ledgerVersion = 1

// maxSweeps bounds the sweep records kept in the ledger (newest kept).
const maxSweeps = 100

// Ledger is the controller's memory, ledger.yaml on the snapshots branch. It
// holds only what a pass needs to recover after a restart, and is rewritten
// in the same commit as the host snapshots it describes, so the two never
// disagree.
type Ledger struct {
	Version int `yaml:"version"`
	// Applied is the last desired-state commit whose snapshots were
	// published; nil before the first publish.
	Applied *AppliedCommit `yaml:"applied,omitempty"`
	// Rejected is the last desired-state commit that was refused (or a fetch
	// that failed, with an empty commit).
	Rejected *Rejection `yaml:"rejected,omitempty"`
	// Hosts is per host: its epoch and the identities it held in Applied.
	Hosts map[string]*HostRecord `yaml:"hosts"`
	// Tombstones are the pending deletes, sorted by host, kind and name.
	Tombstones []*TombstoneRecord `yaml:"tombstones"`
	// Sweeps are the last deletes the controller finalized itself because
	// the host was offline, oldest first, at most 100.
	Sweeps []SweepRecord `yaml:"sweeps,omitempty"`
}

// AppliedCommit names a desired-state commit.
type AppliedCommit struct {
	Commit string `yaml:"commit"`
	Branch string `yaml:"branch"`
}

// Rejection is a refused desired-state commit and why. At is the
// controller's clock when it was first refused.
type Rejection struct {
	Commit string    `yaml:"commit"`
	Reason string    `yaml:"reason"`
	At     time.Time `yaml:"at"`
}

// HostRecord is one host's line in the ledger. Epoch is the last epoch
// published for the host (never reused, even after the host's file is
// removed). Hash identifies the content of the published snapshot without
// its epoch and source (empty when no file is published, or after a fence
// jump to force a republish). VMs and Volumes are the names the host held in
// the applied desired state, sorted: the base tombstones are derived from.
type HostRecord struct {
	Epoch   uint64   `yaml:"epoch"`
	Hash    string   `yaml:"hash,omitempty"`
	VMs     []string `yaml:"vms,flow,omitempty"`
	Volumes []string `yaml:"volumes,flow,omitempty"`
}

// TombstoneRecord is one pending delete: the object's last spec (VM) or size
// (Volume), its attribution, and PublishedAt, the controller's clock when
// the tombstone was first published (the abandon grace counts from it).
// Tombstone.Epoch is the epoch that first published it.
type TombstoneRecord struct {
	Kind        desired.Kind      `yaml:"kind"`
	Name        string            `yaml:"name"`
	Host        string            `yaml:"host"`
	Spec        *desired.VMSpec   `yaml:"spec,omitempty"`
	SizeGB      int               `yaml:"sizeGB,omitempty"`
	Tombstone   desired.Tombstone `yaml:"tombstone"`
	PublishedAt time.Time         `yaml:"publishedAt"`
}

// SweepRecord is a delete the controller finalized without an ack.
type SweepRecord struct {
	Kind   desired.Kind `yaml:"kind"`
	Name   string       `yaml:"name"`
	Host   string       `yaml:"host"`
	Commit string       `yaml:"commit"`
	At     time.Time    `yaml:"at"`
	Reason string       `yaml:"reason"`
}

// ref is an object on a host: the unit tombstones are kept for.
type ref struct {
	Kind desired.Kind
	Name string
	Host string
}

func (t *TombstoneRecord) ref() ref { return ref{t.Kind, t.Name, t.Host} }

func (r ref) String() string { return fmt.Sprintf("%s %s on %s", r.Kind, r.Name, r.Host) }

// newLedger is the ledger of a snapshots branch that has none yet.
func newLedger() *Ledger {
	return &Ledger{Version: ledgerVersion, Hosts: map[string]*HostRecord{}}
}

// parseLedger decodes ledger.yaml strictly. A ledger that cannot be read
// stops the pass: writing over it could reuse epochs.
func parseLedger(data []byte) (*Ledger, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	l := newLedger()
	if err := dec.Decode(l); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("parse %s: %w", LedgerPath, err)
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
	return l, nil
}

// marshal encodes the ledger with tombstones sorted, so equal ledgers give
// equal bytes.
func (l *Ledger) marshal() ([]byte, error) {
	sortTombstones(l.Tombstones)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(l); err != nil {
		return nil, fmt.Errorf("marshal %s: %w", LedgerPath, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("marshal %s: %w", LedgerPath, err)
	}
	return buf.Bytes(), nil
}

func sortTombstones(ts []*TombstoneRecord) {
	sort.Slice(ts, func(i, j int) bool {
		a, b := ts[i], ts[j]
		if a.Host != b.Host {
			return a.Host < b.Host
		}
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		return a.Name < b.Name
	})
}

// clone returns a deep copy a pass may modify. Specs of tombstones are
// shared: a pass never modifies a spec.
func (l *Ledger) clone() *Ledger {
	c := *l
	if l.Applied != nil {
		a := *l.Applied
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
	return &c
}

// host returns the record of host, creating it.
func (l *Ledger) host(name string) *HostRecord {
	rec := l.Hosts[name]
	if rec == nil {
		rec = &HostRecord{}
		l.Hosts[name] = rec
	}
	return rec
}
