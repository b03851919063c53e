// Package fleet is the gitfleet controller (DESIGN.md, Controller
// semantics 1–7). One level-triggered pass reads the desired state at the
// head of the main branch, derives tombstones for objects that left it,
// finalizes tombstones that their hosts acknowledged (or that an offline
// host will never acknowledge), and publishes one snapshot per changed host,
// with a new epoch, together with ledger.yaml, in one compare-and-swap
// commit on the snapshots branch. It then rewrites the README.md summary on
// the status branch when its content changed.
//
// A pass acts only on what it observes in git, never on an event's payload,
// so it may run twice, crash half-way or run after a restart and still
// converge:
//
//	c, err := fleet.New(fleet.Config{URL: "file:///srv/fleet.git"})
//	res, err := c.Pass(ctx) // one pass; res.Rejected when the desired state was refused
//	err = c.Run(ctx, 15*time.Second) // the loop: poll, watch, webhook kicks
//
// Any failure to read the desired state (a bad file, a fetch failure, a
// missing object) keeps the last good snapshots untouched; a git failure is
// reported and retried, never turned into a delete.
package fleet
