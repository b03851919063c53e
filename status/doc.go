// Package status owns the gitfleet/status branch (docs/DESIGN.md, Branches
// and files): its name (Branch), one file per host at Path(host)
// (hosts/<host>.yaml), written by that host's agent, and the fleet summary
// SummaryPath (README.md) written by the controller. It parses and renders
// both and reads all hosts' statuses from a tree of the status branch.
package status
