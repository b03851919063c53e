package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
)

// epochMemory is this controller's own history of epochs: per host, the
// highest epoch it published, or read in a ledger it computed on (the
// authentic one: signed by a controller key, or without a signing key
// the tip's) or in a host's file of that commit (observeBranchEpochs),
// for as long as it ran. The fence recovery follows a host
// status whose lastSeenEpoch no agentKey signature vouches for only this
// far (docs/DESIGN.md, "Epoch bounds"): a status anyone can write, just
// under the highest epoch an agent accepts, no longer moves a host's
// epoch to the bound, while a snapshots branch restored from an old copy
// (its ledger below the epochs this controller published) is still
// followed back up. It is kept in a file beside the cache directory
// (CacheDir + ".epochs", JSON, mode 0600, written when an epoch rises),
// so a restarted controller remembers it; without a CacheDir, in memory.
// A file that does not parse is logged and read as empty: the history
// starts over, which follows less, never more. Safe for concurrent use.
type epochMemory struct {
	path string
	log  *logrus.Entry

	mu   sync.Mutex
	high map[string]uint64
}

// epochMemorySuffix names the file beside CacheDir; epochMemoryFile is
// its format (map keys sorted by encoding/json).
const epochMemorySuffix = ".epochs"

type epochMemoryFile struct {
	Version int               `json:"version"`
	Hosts   map[string]uint64 `json:"hosts"`
}

// openEpochMemory reads the history kept beside cacheDir ("" keeps it in
// memory).
func openEpochMemory(cacheDir string, log *logrus.Entry) *epochMemory {
	m := &epochMemory{log: log, high: map[string]uint64{}}
	if cacheDir == "" {
		return m
	}
	m.path = filepath.Clean(cacheDir) + epochMemorySuffix
	data, err := os.ReadFile(m.path)
	if errors.Is(err, fs.ErrNotExist) {
		return m
	}
	var f epochMemoryFile
	if err == nil {
		err = json.Unmarshal(data, &f)
	}
	if err == nil && f.Version != 1 {
		err = fmt.Errorf("version %d, this controller reads version 1", f.Version)
	}
	if err != nil {
		log.WithError(err).WithField("file", m.path).Warn("the controller's record of the epochs it published is unreadable; it starts over (the fence recovery follows host statuses no further than the ledger until it publishes again)")
		return m
	}
	for h, e := range f.Hosts {
		m.high[h] = e
	}
	return m
}

// bound is the highest epoch this controller's history holds for host.
func (m *epochMemory) bound(host string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.high[host]
}

// note raises the history to the epochs of l, a ledger the controller
// computed on or wrote, and keeps it when one rose. A failure to write
// the file is logged: the history in memory still holds.
func (m *epochMemory) note(l *snapshots.Ledger) {
	if l == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	rose := false
	for h, rec := range l.Hosts {
		if rec != nil && rec.Epoch > m.high[h] {
			m.high[h], rose = rec.Epoch, true
		}
	}
	if !rose || m.path == "" {
		return
	}
	if err := m.save(); err != nil {
		m.log.WithError(err).WithField("file", m.path).Warn("keep the controller's record of the epochs it published")
	}
}

// save writes the file: a temporary file beside it, synced, renamed over
// it. Caller holds m.mu.
func (m *epochMemory) save() error {
	data, err := json.Marshal(epochMemoryFile{Version: 1, Hosts: m.high})
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(m.path), filepath.Base(m.path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), m.path)
}

// reportUnfollowed puts the statuses whose lastSeenEpoch the fence
// recovery did not follow into res, and logs each once per host and
// reason (a forged status stays on its branch pass after pass).
func (c *Controller) reportUnfollowed(res *PassResult, o *output) {
	res.EpochsNotFollowed = o.unfollowed
	if c.unfollowedLogged == nil {
		c.unfollowedLogged = map[string]string{}
	}
	for h, why := range o.unfollowed {
		if c.unfollowedLogged[h] != why {
			c.unfollowedLogged[h] = why
			c.log.WithField("host", h).Error("status epoch not followed: " + why)
		}
	}
	for h := range c.unfollowedLogged {
		if _, ok := o.unfollowed[h]; !ok {
			delete(c.unfollowedLogged, h)
		}
	}
}

// observeBranchEpochs adds to the history the epoch of each host's file
// in the commit whose ledger the pass computes on (read reads it,
// bounded: the tip without a signing key; with one, the newest commit a
// controller key signed), for each host whose status (one no signature
// vouches for) reports an epoch beyond the history: what that commit
// holds is what agents accept. Without keys, a snapshot someone pushed
// at a high epoch (a forged tombstone) is one the fence recovery must
// follow the host's agent past, to publish the host above it; with keys,
// a commit a controller key signed (another controller's, or one pushed
// back) is a controller's history. A status alone, with no such file,
// moves nothing.
func (c *Controller) observeBranchEpochs(read func(string) ([]byte, error), statuses map[string]*status.Status, signed map[string]bool) {
	for host, st := range statuses {
		if st == nil || signed[host] || st.LastSeenEpoch <= c.epochs.bound(host) {
			continue
		}
		data, err := read(snapshots.Path(host))
		if err != nil {
			continue
		}
		snap, err := snapshots.ParseSnapshot(data)
		if err != nil || snap.Host != host || snap.Epoch > snapshots.MaxAcceptedEpoch {
			continue
		}
		c.epochs.raise(host, snap.Epoch)
	}
}

// raise raises host's history to epoch.
func (m *epochMemory) raise(host string, epoch uint64) {
	m.note(&snapshots.Ledger{Hosts: map[string]*snapshots.HostRecord{host: {Epoch: epoch}}})
}
