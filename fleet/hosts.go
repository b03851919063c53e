package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/status"
)

// hostTree is a host branch's tip and the one file of its tree a pass
// reads (status.Path of its host; none when absent), as the last pass
// listed it: a tip that did not move is not listed again.
type hostTree struct {
	tip   string
	files fileList
}

// fileList is a desired.Tree of files listed once.
type fileList []desired.File

func (l fileList) Walk(fn func(desired.File) error) error {
	for _, f := range l {
		if err := fn(f); err != nil {
			return err
		}
	}
	return nil
}

// readHostTree lists host's status file in the tree of tip.
func (c *Controller) readHostTree(host, tip string) (hostTree, error) {
	tree, err := c.hosts.Tree(tip, "")
	if err != nil {
		return hostTree{}, err
	}
	ht := hostTree{tip: tip}
	want := status.Path(host)
	err = tree.Walk(func(f desired.File) error {
		if f.Path == want {
			ht.files = append(ht.files, f)
		}
		return nil
	})
	return ht, err
}

// statusCopies are the host files of the status branch that differ from
// their host branch's: host → the host branch's tip, and whether any of
// them says something new (an event) rather than only a later heartbeat.
type statusCopies struct {
	tips  map[string]string
	event bool
}

// fetchTips fetches, in one fetch of the tip repository, the snapshots
// branch, the status branch and every host branch, and records their tips
// for this pass (c.fetched: publish and the status write build on them
// without fetching again). A branch the remote lacks is absent.
func (c *Controller) fetchTips(ctx context.Context) (map[string]string, error) {
	start := time.Now()
	var tips map[string]string
	var err error
	if c.hosts == c.tips {
		tips, err = c.tips.FetchAll(ctx, []string{c.cfg.SnapshotsBranch, c.cfg.StatusBranch}, []string{status.HostBranchPrefix})
	} else {
		tips, err = c.fetchSplit(ctx)
	}
	c.metrics.gitOp(GitFetch, time.Since(start), err != nil)
	if err != nil {
		return nil, err // gitsource names the branches and the remote
	}
	c.fetched = map[string]string{c.cfg.SnapshotsBranch: tips[c.cfg.SnapshotsBranch], c.cfg.StatusBranch: tips[c.cfg.StatusBranch]}
	return tips, nil
}

// fetchSplit is fetchTips with the status and host branches in a
// repository of their own: one fetch of each repository.
func (c *Controller) fetchSplit(ctx context.Context) (map[string]string, error) {
	tips, err := c.tips.FetchAll(ctx, []string{c.cfg.SnapshotsBranch}, nil)
	if err != nil {
		return nil, err
	}
	hosts, err := c.hosts.FetchAll(ctx, []string{c.cfg.StatusBranch}, []string{status.HostBranchPrefix})
	if err != nil {
		return nil, fmt.Errorf("status repository: %w", err)
	}
	for b, t := range hosts {
		tips[b] = t
	}
	return tips, nil
}

// readStatuses reads every host's status: from its host branch
// (status.HostBranchPrefix, fetched with the snapshots and status
// branches in one fetch), or, for a host without one, from its file on
// the status branch, where an agent of the old layout writes
// (docs/DESIGN.md, Branches and files: migration). It returns a name of
// what was read (the tips), the reports sorted by host, the copies on the
// status branch that lag their host branch, and each host branch's tip by
// host. A host branch whose tip is the one the last pass read is not read
// again (its tree is kept).
func (c *Controller) readStatuses(ctx context.Context) (string, []status.Report, statusCopies, map[string]string, error) {
	var cp statusCopies
	branches, err := c.fetchTips(ctx)
	if err != nil {
		return "", nil, cp, nil, err
	}
	statusTip := branches[c.cfg.StatusBranch]
	hostTips := map[string]string{}
	trees := map[string]desired.Tree{}
	kept := make(map[string]hostTree, len(c.hostTrees))
	for b, tip := range branches {
		host, ok := status.HostFromBranch(b)
		if !ok {
			continue // gitfleet/hosts/a/b, or not a host branch at all
		}
		ht, ok := c.hostTrees[host]
		if !ok || ht.tip != tip {
			if ht, err = c.readHostTree(host, tip); err != nil {
				return "", nil, cp, nil, fmt.Errorf("read tree of %s at %s: %w", b, desired.Hash(tip).Short(), err)
			}
		}
		hostTips[host], trees[host] = tip, ht.files
		kept[host] = ht
	}
	c.hostTrees = kept
	var statusTree desired.Tree = status.BranchFiles(nil)
	if statusTip != "" {
		if statusTree, err = c.hosts.Tree(statusTip, ""); err != nil {
			return "", nil, cp, nil, fmt.Errorf("read tree of %s: %w", desired.Hash(statusTip).Short(), err)
		}
	}
	read, err := c.statuses.ReadTrees(statusTree, status.BranchFiles(trees))
	if err != nil {
		return "", nil, cp, nil, err
	}
	onBranch, live := read[0], read[1]
	copies := make(map[string]status.Report, len(onBranch))
	for _, rep := range onBranch {
		copies[rep.Host] = rep
	}
	reports := live
	seen := make(map[string]bool, len(live))
	for _, rep := range live {
		seen[rep.Host] = true
	}
	for _, rep := range onBranch {
		if !seen[rep.Host] {
			reports = append(reports, rep) // the old layout's file
		}
	}
	sort.Slice(reports, func(i, j int) bool { return reports[i].Host < reports[j].Host })
	cp = c.lagging(live, copies, hostTips)
	return tipsName(statusTip, hostTips), reports, cp, hostTips, nil
}

// lagging compares each host branch's status with its copy on the status
// branch: a copy missing or saying something else is an event; one behind
// only in heartbeat and observedAt is not.
func (c *Controller) lagging(live []status.Report, copies map[string]status.Report, hostTips map[string]string) statusCopies {
	cp := statusCopies{tips: map[string]string{}}
	keep := make(map[string]string, len(live))
	for _, rep := range live {
		if errors.Is(rep.Err, status.ErrFileTooLarge) {
			continue // never copied (copyFiles): no copy can catch up
		}
		old, ok := copies[rep.Host]
		if ok && old.ID == rep.ID {
			continue
		}
		cp.tips[rep.Host] = hostTips[rep.Host]
		if !ok || rep.Status == nil || old.Status == nil || c.eventKey(old, keep) != c.eventKey(rep, keep) {
			cp.event = true
		}
	}
	c.eventKeys = keep
	return cp
}

// eventKey is a digest of what rep's status says but for heartbeat and
// observedAt, cached by blob hash (keep collects this pass's entries). It
// digests the status as JSON, not as status.Marshal's YAML: a heartbeat
// changes every host's blob, so a pass over 1,000 hosts computes 1,000
// keys, and YAML encoding was the largest cost of such a pass. Statuses
// that differ only in a list absent against one empty (a file written
// by hand) digest apart: their copy is written at once, never held back.
func (c *Controller) eventKey(rep status.Report, keep map[string]string) string {
	if k, ok := keep[rep.ID]; ok {
		return k
	}
	k, ok := c.eventKeys[rep.ID]
	if !ok {
		st := *rep.Status
		st.Heartbeat, st.ObservedAt = 0, time.Time{}
		data, err := json.Marshal(&st)
		if err != nil {
			k = "unencodable " + rep.ID
		} else {
			sum := sha256.Sum256(data)
			k = hex.EncodeToString(sum[:])
		}
	}
	keep[rep.ID] = k
	return k
}

// tipsName names the status branch tip and every host branch tip in one
// string, for the skip key.
func tipsName(statusTip string, hostTips map[string]string) string {
	if len(hostTips) == 0 {
		return statusTip
	}
	lines := make([]string, 0, len(hostTips))
	for h, tip := range hostTips {
		lines = append(lines, h+" "+tip)
	}
	sort.Strings(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return statusTip + "+" + hex.EncodeToString(sum[:])
}

// copyFiles reads the host branch files of cp, to write on the status
// branch as they are.
func (c *Controller) copyFiles(cp statusCopies) (map[string][]byte, error) {
	files := make(map[string][]byte, len(cp.tips))
	for host, tip := range cp.tips {
		data, err := c.hosts.ReadFileMax(tip, status.Path(host), status.MaxFileBytes)
		if errors.Is(err, gitsource.ErrFileTooLarge) {
			continue // refused as that host's status error; never copied
		}
		if err != nil {
			return nil, fmt.Errorf("read %s of %s: %w", status.Path(host), status.HostBranch(host), err)
		}
		files[status.Path(host)] = data
	}
	return files, nil
}
