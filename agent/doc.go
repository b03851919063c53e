// Package agent is gitfleet's host side: it fetches this host's snapshot from
// the gitfleet/snapshots branch, fences snapshots older than the last one it
// accepted, converges volumes, runs one reconcile worker per VM against a
// Provisioner, keeps its state on disk, and writes this host's status to the
// gitfleet/status branch (docs/DESIGN.md, Agent semantics). It owns no
// branch file's format: it reads hosts/<host>.yaml of the snapshots branch
// (package snapshots) and writes its own hosts/<host>.yaml of
// the status branch (package status).
//
// The pieces, from the bottom up:
//
//   - Store is the on-disk state (default /var/lib/gitfleet, mode 0700): one
//     record per VM, the volumes directory, the last accepted snapshot, the
//     last seen epoch and the status heartbeat counter.
//   - Engine is the level-triggered reconcile loop. Engine.Tick takes a
//     snapshot, refuses it if it is fenced, converges volumes, and kicks
//     the per-VM workers; Engine.Report describes what is on the host.
//   - Source fetches and parses this host's snapshot.
//   - Agent ties them together with the status write-back and runs the loop.
//
// The promise the package keeps: nothing a guest wrote is destroyed except by
// a tombstone in an accepted snapshot whose grace has passed. A failure to
// read git, a record or a file is reported and retried, never read as
// "delete". Absence is not a delete either: a VM the snapshot drops without
// a tombstone (a repository restored from a backup, a hand-edited snapshots
// branch, a controller bug) is left as it is for vanishGrace, then shut down
// and kept, and reported as vanished; a volume the snapshot drops is kept as
// an orphan. A snapshot at the last accepted epoch with other content is
// refused like an older one (fenceViolation): only a higher epoch changes
// what a host runs.
package agent
