package status

import (
	"sort"
	"strings"
	"time"

	"github.com/gitfleet/gitfleet/desired"
)

// HostBranchPrefix starts the name of every host branch: host hv-a's agent
// writes its status to gitfleet/hosts/hv-a and nothing else writes there
// (docs/DESIGN.md, Branches and files). The controller reads them all with
// one glob fetch and copies them to the status branch.
const HostBranchPrefix = "gitfleet/hosts/"

// HostBranch is the branch host's agent writes its status to:
// gitfleet/hosts/<host>. The status file on it is at Path(host), the same
// path as its copy on the status branch.
func HostBranch(host string) string { return HostBranchPrefix + host }

// HostFromBranch returns the host of a host branch gitfleet/hosts/<host>,
// and false for any other branch (one more level deep included).
func HostFromBranch(branch string) (string, bool) {
	host, ok := strings.CutPrefix(branch, HostBranchPrefix)
	if !ok || host == "" || strings.Contains(host, "/") {
		return "", false
	}
	return host, true
}

// HeartbeatTrailer is the last line of the message of a host-branch
// commit whose status differs from its parent's only in heartbeat and
// observedAt. Only such a tip is ever replaced by the next heartbeat-only
// write (see Writer): a commit without it records an event and stays in
// history.
const HeartbeatTrailer = "Gitfleet-Heartbeat-Only: true"

// IsHeartbeatOnly reports whether a commit message carries
// HeartbeatTrailer on a line of its own.
func IsHeartbeatOnly(message string) bool {
	for _, line := range strings.Split(message, "\n") {
		if strings.TrimSpace(line) == HeartbeatTrailer {
			return true
		}
	}
	return false
}

// SameExceptHeartbeat reports whether a and b say the same thing but for
// Heartbeat and ObservedAt, which every write moves: the rest (phases,
// acks, errors, epochs, agent, volumes) compared as Marshal writes it, so
// a nil list and an empty one are alike. Either nil: false.
func SameExceptHeartbeat(a, b *Status) bool {
	if a == nil || b == nil {
		return false
	}
	ka, erra := EventKey(a)
	kb, errb := EventKey(b)
	return erra == nil && errb == nil && string(ka) == string(kb)
}

// EventKey is st as Marshal writes it with Heartbeat and ObservedAt
// zeroed: two statuses with equal keys differ only in what every write
// moves. Errors are Marshal's.
func EventKey(st *Status) ([]byte, error) {
	c := *st
	c.Heartbeat, c.ObservedAt = 0, time.Time{}
	return Marshal(&c)
}

// BranchFiles is a desired.Tree of the status files of host branches:
// for each host of trees (the tree of its branch's tip), the one file at
// Path(host), hosts in name order. Anything else on a host branch
// (another host's path, any other file) is not walked: an agent's branch
// speaks for its host only.
func BranchFiles(trees map[string]desired.Tree) desired.Tree { return branchFiles(trees) }

type branchFiles map[string]desired.Tree

func (b branchFiles) Walk(fn func(desired.File) error) error {
	hosts := make([]string, 0, len(b))
	for h := range b {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		want := Path(h)
		err := b[h].Walk(func(f desired.File) error {
			if f.Path != want {
				return nil
			}
			return fn(f)
		})
		if err != nil {
			return err
		}
	}
	return nil
}
