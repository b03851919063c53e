// Package fleet is the gitfleet controller (docs/DESIGN.md, Controller
// semantics 1–7). One level-triggered pass reads the desired state at the
// head of the main branch, derives tombstones for objects that left it,
// finalizes tombstones that their hosts acknowledged (or that an offline
// host will never acknowledge), and publishes one snapshot per changed host,
// with a new epoch, together with ledger.yaml, in one compare-and-swap
// commit on the snapshots branch. It then rewrites the README.md summary on
// the status branch when its content changed.
//
// It owns no branch file's format: it writes every file of the snapshots
// branch (package snapshots owns their names, the snapshot format and
// ledger.yaml) and README.md of the status branch
// (package status), and reads the objects of the desired branch (package
// desired) and the hosts' status files (package status).
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
//
// ledger.yaml, beside the snapshots, is the controller's only memory
// (package snapshots owns its format and its reader). The decisions of a
// pass are compute's named steps over it (compute.go), pinned by the
// scenarios in testdata/compute.
//
// applied records the desired branch and the objects' directory (path) too:
// a controller configured with another branch or path refuses to publish
// (ErrLedgerMismatch) rather than read the other one's objects as deleted.
//
// When the applied commit is not an ancestor of the new head (a
// force-push, a reset, an unrelated history), the objects the new head lacks
// are not tombstoned: they are retained, published live with their last
// spec, listed in the summary and counted by gitfleet_controller_retained.
// They are in neither the desired state nor hosts[h].vms, so no later
// commit tombstones them; one desired on its host again leaves the list.
// Deleting one takes a reviewed delete: add its file back, then delete it.
// Tombstones pending before the rewrite stay pending.
//
// A host file on the branch tip that is not the snapshot the computation
// renders for it (edited, forged or removed) is published again with a new
// epoch; hosts[h].file, a hash of the published file, is recorded but never
// believed (it is on the same branch as the file).
//
// Beyond validation, a head is rejected when its commits are not signed as
// Config.Verify asks (trust.go, package trust), or when it would newly
// tombstone more than the mass-delete guard allows without the
// Gitfleet-Allow-Deletes trailer (DeleteGuard). Statuses of hosts neither
// desired nor in the ledger are ignored; a host whose epoch would pass
// snapshots.MaxAcceptedEpoch is held while the others publish.
//
// hosts[h].vms and volumes are the names h held in the applied commit: the
// next commit's tombstones are what it lacks. hash identifies the published
// snapshot's content without its epoch, so an unchanged host keeps its
// epoch. A host's epoch stays after its file is removed and is never
// reused. The whole file is rewritten in the same commit as the snapshots
// it describes.
package fleet
