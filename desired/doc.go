// Package desired is gitfleet's object model: the VM, Volume and Host kinds of
// apiVersion gitfleet.dev/v1alpha1, their strict YAML decoding and validation
// with FILE:LINE:COL errors, loading a whole repository tree into a Fleet,
// computing one Snapshot per host, and the Plan between two fleets.
//
// Every *.yaml / *.yml file outside dot-directories is exactly one object. A
// file that is not a valid object is an error, never skipped: skipping a file
// would read as deleting what it defined.
//
// The contracts here are the ones fixed in DESIGN.md (Objects; Branches and
// files): identity is kind + metadata.name, never the file path.
package desired
