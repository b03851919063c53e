package status

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/gitfleet/gitfleet/gitsource"
)

// Writer writes one host's status to its host branch (HostBranch), the
// agent's only write target: history grows with events, not with time.
//
// A write whose status differs from the one at the tip only in Heartbeat
// and ObservedAt is heartbeat-only: its commit carries HeartbeatTrailer.
// Any write on a heartbeat-only tip replaces it (same parent,
// compare-and-swap from the old tip; gitsource.Write.ReplaceTip): the tip
// said nothing its parent did not, but for the heartbeat, which the new
// commit carries on. So an idle host's branch holds its last event and one
// heartbeat commit on top, and an event lands right after the previous
// one. A commit without the trailer (a phase, an ack, an error, an epoch)
// is never replaced: every event stays in history. With AppendOnly, or once the remote
// refused a replacement (gitsource.ErrNonFastForward: a git host that
// forbids non-fast-forward updates), every write is a new commit.
//
// A heartbeat stores nothing new on the remote once an unsigned writer
// has two heartbeat-only commits on the same event: the write after them
// points the branch back at the other one (gitsource.Write.Reuse, a
// compare-and-swap from the tip this Writer left), so the branch
// alternates between two commits whose heartbeats differ (the status file
// changes, which is what the controller's liveness watches) and no
// heartbeat leaves an unreachable object behind; the heartbeat number
// then goes back and forth between the two until the next event. A
// signed writer (Signer) writes a new commit with a higher heartbeat
// every time: a controller takes a signed status as a heartbeat only
// when its number is above every one it saw signed (a replayed old
// commit is none), docs/DESIGN.md "History grows with events".
//
// Each write builds on the tip this Writer's Repo last saw
// (gitsource.Repo.EditOwn): one round trip with the remote, the push, when
// nothing else wrote the branch.
//
// The first Write of a Writer whose branch does not exist yet reads
// OldBranch (the shared status branch of the old layout) once: the
// heartbeat continues from the host's old file there, so it never goes
// back. Write calls must not overlap (the agent serializes them).
type Writer struct {
	Repo *gitsource.Repo
	Host string
	// Branch defaults to HostBranch(Host).
	Branch string
	// OldBranch is read once for the migration from the shared status
	// branch; empty: not read.
	OldBranch  string
	AppendOnly bool
	// Signer, when set, signs every commit written (the agent's host key:
	// docs/DESIGN.md, "Authentic acks"); nil writes unsigned commits.
	Signer gitsource.CommitSigner

	migrated  bool
	forbidden bool
	// last is the commit this Writer's last write left at the tip, beat
	// its other heartbeat commit on the same parent (zero: none).
	last, beat beatCommit
	// high is the highest heartbeat this Writer wrote.
	high uint64
}

// beatCommit is a commit a Writer wrote: its hash, first parent,
// heartbeat, the EventKey of its status (a copy: the caller's Status may
// change later) and whether it is heartbeat-only.
type beatCommit struct {
	commit, parent string
	heartbeat      uint64
	key            []byte
	heartbeatOnly  bool
}

// Written says what one Write did: the heartbeat the status was written
// with, the new tip, whether the status was heartbeat-only and whether it
// replaced the tip. Refused is set on the write that found the remote
// refusing replacements (written appended instead; later writes append).
type Written struct {
	Heartbeat     uint64
	Commit        string
	HeartbeatOnly bool
	Replaced      bool
	Refused       bool
	// Reused is set when the write pointed the branch at its other
	// heartbeat commit instead of writing one (Heartbeat is that
	// commit's, below the last one written).
	Reused bool
}

// Write writes st (not modified) with heartbeat st.Heartbeat, or one more
// than the heartbeat at the tip when that is not below it (and not the
// largest uint64, which only another writer puts there). Errors are
// git's (wrapped; ErrConflict after every attempt lost, ctx's) or
// Marshal's.
func (w *Writer) Write(ctx context.Context, st *Status) (Written, error) {
	branch := w.Branch
	if branch == "" {
		branch = HostBranch(w.Host)
	}
	floor, err := w.migrate(ctx, branch)
	if err != nil {
		return Written{}, err
	}
	out, err := w.write(ctx, branch, st, max(floor, w.high+1), w.AppendOnly || w.forbidden)
	if errors.Is(err, gitsource.ErrNonFastForward) {
		w.forbidden = true
		out, err = w.write(ctx, branch, st, max(floor, w.high+1), true)
		out.Refused = true
	}
	return out, err
}

// other is the heartbeat commit to point the branch at instead of writing
// c, "" when there is none: the tip is the heartbeat-only commit this
// Writer left, its other one is on the same parent and says what c says
// but for the heartbeat. Never for a signed or appending writer.
func (w *Writer) other(tip *gitsource.Commit, c *Status, appendOnly bool) string {
	switch {
	case appendOnly || w.Signer != nil || tip == nil || w.beat.commit == "":
	case tip.Hash != w.last.commit || !w.last.heartbeatOnly || w.beat.parent != w.last.parent:
	default:
		if key, err := EventKey(c); err == nil && string(key) == string(w.beat.key) {
			return w.beat.commit
		}
	}
	return ""
}

// wrote records the commit one write left at the tip.
func (w *Writer) wrote(b beatCommit, reused bool) {
	w.high = max(w.high, b.heartbeat)
	switch {
	case reused:
		w.last, w.beat = w.beat, w.last
	case b.heartbeatOnly && w.last.heartbeatOnly && w.last.parent == b.parent && w.last.commit != b.commit:
		w.last, w.beat = b, w.last
	default:
		w.last, w.beat = b, beatCommit{}
	}
}

// write is one Edit of branch; replace allows replacing a heartbeat-only
// tip.
func (w *Writer) write(ctx context.Context, branch string, st *Status, floor uint64, appendOnly bool) (Written, error) {
	path := Path(w.Host)
	var out Written
	var parent, reuse string
	c := *st
	tip, err := w.Repo.EditOwn(ctx, branch, func(tip *gitsource.Commit, read func(string) ([]byte, error)) (gitsource.Write, error) {
		c.Heartbeat = max(st.Heartbeat, floor)
		var prev *Status
		// A broken file is replaced, and so is a directory planted there.
		if old, err := read(path); err == nil {
			prev, _ = Parse(path, old)
		} else if !errors.Is(err, gitsource.ErrFileNotFound) && !errors.Is(err, gitsource.ErrNotAFile) {
			return gitsource.Write{}, err
		}
		if prev != nil && prev.Heartbeat >= c.Heartbeat && prev.Heartbeat < math.MaxUint64 {
			// The tip may be another writer's (a forged status on the
			// branch): past the largest counter, this write keeps its
			// own, which differs all the same.
			c.Heartbeat = prev.Heartbeat + 1
		}
		data, err := Marshal(&c)
		if err != nil {
			return gitsource.Write{}, err
		}
		out = Written{Heartbeat: c.Heartbeat, HeartbeatOnly: SameExceptHeartbeat(prev, &c)}
		msg := fmt.Sprintf("status: %s heartbeat %d", w.Host, c.Heartbeat)
		if out.HeartbeatOnly {
			msg += "\n\n" + HeartbeatTrailer + "\n"
		}
		out.Replaced = !appendOnly && tip != nil && len(tip.Parents) == 1 && IsHeartbeatOnly(tip.Message)
		parent, reuse = "", ""
		if out.Replaced {
			parent = tip.Parents[0]
		} else if tip != nil {
			parent = tip.Hash
		}
		if out.HeartbeatOnly {
			reuse = w.other(tip, &c, appendOnly)
		}
		return gitsource.Write{Files: map[string][]byte{path: data}, Message: msg, ReplaceTip: out.Replaced, Signer: w.Signer, Reuse: reuse}, nil
	})
	if err != nil {
		return out, fmt.Errorf("write status %s to %s: %w", path, branch, err)
	}
	out.Commit = tip
	key, _ := EventKey(&c)
	written := beatCommit{commit: tip, parent: parent, heartbeat: out.Heartbeat, key: key, heartbeatOnly: out.HeartbeatOnly}
	if out.Reused = reuse != "" && tip == reuse; out.Reused {
		out.Heartbeat = w.beat.heartbeat
	}
	w.wrote(written, out.Reused)
	return out, nil
}

// migrate reads the old layout once, when branch does not exist yet: the
// heartbeat of the host's file on OldBranch, plus one (0 when none).
func (w *Writer) migrate(ctx context.Context, branch string) (uint64, error) {
	if w.migrated || w.OldBranch == "" {
		return 0, nil
	}
	_, err := w.Repo.Fetch(ctx, branch)
	if err == nil {
		w.migrated = true
		return 0, nil
	}
	if !errors.Is(err, gitsource.ErrBranchNotFound) {
		return 0, fmt.Errorf("write status: %w", err)
	}
	tip, err := w.Repo.Fetch(ctx, w.OldBranch)
	if errors.Is(err, gitsource.ErrBranchNotFound) {
		w.migrated = true
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("write status: read the old layout: %w", err)
	}
	w.migrated = true
	data, err := w.Repo.ReadFileMax(tip, Path(w.Host), MaxFileBytes)
	if err != nil {
		return 0, nil // nothing there (or nothing readable) to continue from
	}
	old, err := Parse(Path(w.Host), data)
	if err != nil || old.Host != w.Host {
		return 0, nil
	}
	return old.Heartbeat + 1, nil
}
