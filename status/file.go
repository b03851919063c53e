package status

import (
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/internal/hostfile"
	"github.com/gitfleet/gitfleet/internal/parallel"
	"github.com/gitfleet/gitfleet/internal/redact"
)

// MaxFileBytes is the largest status file a reader parses (4 MiB; a host
// with ten thousand VMs writes well under 1 MiB). A bigger file, forged or
// broken, is refused by its size before it is read, and reported as the
// host's status error.
const MaxFileBytes = 4 << 20

// ErrFileTooLarge is wrapped by the error of a status file over
// MaxFileBytes.
var ErrFileTooLarge = errors.New("status file too large")

// ErrHostMismatch is returned when a status file's host field does not name
// the host of its path (hosts/<host>.yaml): an agent must write only its own
// file.
var ErrHostMismatch = errors.New("status host does not match its path")

// Parse decodes one status file strictly, with desired.Decode (the rules of
// object files: one document that is a mapping, no unknown fields or
// duplicate keys, no coercion, no anchors or aliases) and at most
// MaxFileBytes bytes; host must be written and be a name (an RFC 1123
// label). name is the file's path on the status branch; the error is
// "parse status: " and a desired.ErrorList whose entries format as
// NAME:LINE:COL: FIELD: message. A status file is written by one host's
// agent and read by everyone: nothing in it is trusted.
func Parse(name string, data []byte) (*Status, error) {
	var st Status
	doc := desired.Decode(name, data, &st, desired.Format{
		Noun: "status file", Shape: "a mapping with host, agent, heartbeat, vms and volumes", MaxBytes: MaxFileBytes})
	if doc.Required("host") {
		doc.Name("host", st.Host)
	}
	if err := doc.Err(); err != nil {
		return nil, fmt.Errorf("parse status: %w", err)
	}
	return &st, nil
}

// Marshal encodes st as the YAML of a status file. Slices that are nil are
// written as empty lists so a reader never confuses "none" with "unknown".
// Every free-text field (errors, messages, reasons) is passed through
// redact.Text: an error that quotes a URL with a token never reaches the
// branch.
func Marshal(st *Status) ([]byte, error) {
	c := redacted(st)
	if c.VMs == nil {
		c.VMs = []VM{}
	}
	if c.Quarantined == nil {
		c.Quarantined = []Quarantine{}
	}
	if c.Destroyed == nil {
		c.Destroyed = []string{}
	}
	if c.Volumes == nil {
		c.Volumes = []Volume{}
	}
	b, err := desired.Encode(&c)
	if err != nil {
		return nil, fmt.Errorf("marshal status of %s: %w", st.Host, err)
	}
	return b, nil
}

// HostFromPath returns the host of a status path hosts/<host>.yaml, and
// false for any other path (README.md, say).
func HostFromPath(p string) (string, bool) { return hostfile.Host(p) }

// Report is one host's status file as read from the status branch. ID is
// the file's blob hash (empty when the tree does not know it): it changes on
// every write of the agent, which is how the controller judges liveness.
// Err is set, and Status nil, when the file could not be read or parsed; a
// broken status file never stops the others from being read.
type Report struct {
	Host   string
	ID     string
	Status *Status
	Err    error
}

// Reader reads all hosts' statuses from a tree of the status branch, caching
// parsed files by blob hash so that a pass after one agent's write parses one
// file. A Reader is safe for concurrent use.
type Reader struct {
	mu    sync.Mutex
	cache map[string]*Status // blob hash → parsed status
}

// NewReader returns a Reader with an empty cache.
func NewReader() *Reader { return &Reader{cache: map[string]*Status{}} }

// ReadAll returns one Report per hosts/<host>.yaml file of tree, sorted by
// host. A status whose host field does not match its path gets Err wrapping
// ErrHostMismatch. An error of the tree itself is returned as an error and
// never reads as fewer hosts. The returned Statuses are shared with the cache
// and must not be modified.
func (r *Reader) ReadAll(tree desired.Tree) ([]Report, error) {
	reps, err := r.ReadTrees(tree)
	if err != nil {
		return nil, err
	}
	return reps[0], nil
}

// ReadTrees is ReadAll of each tree (the status branch's, and
// BranchFiles of the host branches, say), sharing one cache: a file
// already parsed from any of them is not parsed again, and the cache
// keeps exactly the files of these trees.
func (r *Reader) ReadTrees(trees ...desired.Tree) ([][]Report, error) {
	out := make([][]Report, len(trees))
	seen := map[string]bool{}
	for i, tree := range trees {
		reps, err := r.readTree(tree, seen)
		if err != nil {
			return nil, err
		}
		out[i] = reps
	}
	r.mu.Lock()
	for id := range r.cache {
		if !seen[id] {
			delete(r.cache, id)
		}
	}
	r.mu.Unlock()
	return out, nil
}

// readTree reads the status files of one tree, adding their blob hashes
// to seen. The files the cache lacks are read and parsed by
// GOMAXPROCS workers (a heartbeat of every host changes every blob, and
// parsing is most of a pass over a thousand statuses), as desired.Loader
// parses a tree.
func (r *Reader) readTree(tree desired.Tree, seen map[string]bool) ([]Report, error) {
	var out []Report
	var files []desired.File
	err := tree.Walk(func(f desired.File) error {
		host, ok := HostFromPath(f.Path)
		if !ok {
			return nil
		}
		seen[f.ID] = true
		out = append(out, Report{Host: host, ID: f.ID})
		files = append(files, f)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read statuses: %w", err)
	}
	parallel.For(len(out), func(i int) {
		rep := &out[i]
		rep.Status, rep.Err = r.read(files[i])
		if rep.Err == nil && rep.Status.Host != rep.Host {
			rep.Status, rep.Err = nil, fmt.Errorf("read status %s: host %q: %w", files[i].Path, rep.Status.Host, ErrHostMismatch)
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
	return out, nil
}

// read is one file's status: from the cache, else read and parsed (and
// then cached). Safe to call concurrently.
func (r *Reader) read(f desired.File) (*Status, error) {
	if f.ID != "" {
		r.mu.Lock()
		st, ok := r.cache[f.ID]
		r.mu.Unlock()
		if ok {
			return st, nil
		}
	}
	if f.Size > MaxFileBytes {
		return nil, fmt.Errorf("read status %s: %w: %d bytes, the limit is %d", f.Path, ErrFileTooLarge, f.Size, MaxFileBytes)
	}
	data, err := f.Read()
	if err != nil {
		return nil, fmt.Errorf("read status %s: %w", f.Path, err)
	}
	if int64(len(data)) > MaxFileBytes {
		return nil, fmt.Errorf("read status %s: %w: %d bytes, the limit is %d", f.Path, ErrFileTooLarge, len(data), MaxFileBytes)
	}
	st, err := Parse(f.Path, data)
	if err != nil {
		return nil, err
	}
	if f.ID != "" {
		r.mu.Lock()
		r.cache[f.ID] = st
		r.mu.Unlock()
	}
	return st, nil
}

// redacted returns a copy of st (sharing nothing Marshal changes) with its
// free-text fields redacted.
func redacted(st *Status) Status {
	c := *st
	c.SnapshotError = redact.Text(c.SnapshotError)
	c.VMs = append([]VM(nil), st.VMs...)
	for i := range c.VMs {
		c.VMs[i].LastError = redact.Text(c.VMs[i].LastError)
		c.VMs[i].Message = redact.Text(c.VMs[i].Message)
	}
	c.Quarantined = append([]Quarantine(nil), st.Quarantined...)
	for i := range c.Quarantined {
		c.Quarantined[i].LastError = redact.Text(c.Quarantined[i].LastError)
	}
	if st.QuarantinedVolumes != nil {
		c.QuarantinedVolumes = append([]Quarantine(nil), st.QuarantinedVolumes...)
		for i := range c.QuarantinedVolumes {
			c.QuarantinedVolumes[i].LastError = redact.Text(c.QuarantinedVolumes[i].LastError)
		}
	}
	if st.Suspended != nil {
		sus := *st.Suspended
		sus.Reason = redact.Text(sus.Reason)
		c.Suspended = &sus
	}
	c.Vanished = append([]Vanished(nil), st.Vanished...)
	for i := range c.Vanished {
		c.Vanished[i].LastError = redact.Text(c.Vanished[i].LastError)
		c.Vanished[i].Reason = redact.Text(c.Vanished[i].Reason)
	}
	return c
}
