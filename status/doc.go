// Package status is the status file format of the gitfleet/status branch
// (docs/DESIGN.md, Branches and files): one file per host at hosts/<host>.yaml,
// written by that host's agent, and the fleet summary README.md written by
// the controller. It parses and renders both and reads all hosts' statuses
// from a tree of the status branch.
package status
