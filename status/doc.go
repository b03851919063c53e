// Package status owns the status branches (docs/DESIGN.md, Branches and
// files): each host's own branch HostBranch(host) (gitfleet/hosts/<host>),
// written by that host's agent alone through a Writer, holding its status
// file at Path(host) (hosts/<host>.yaml); and the shared branch Branch
// (gitfleet/status), written by the controller alone, holding the fleet
// summary SummaryPath (README.md), controller.yaml and a copy of every
// host's status file. It parses and renders both, tells a heartbeat-only
// change from an event (SameExceptHeartbeat), and reads all hosts'
// statuses from the trees of those branches (Reader).
package status
