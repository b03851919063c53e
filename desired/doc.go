// Package desired is gitfleet's object model: the VM, Volume, Host and
// Profile kinds of apiVersion gitfleet.dev/v1alpha1, their strict YAML
// decoding and validation with FILE:LINE:COL errors, loading a whole
// repository tree into a Fleet, and the Plan between two fleets. It owns the format of the object files
// on the desired branch; package snapshots owns the snapshot files the
// controller builds from them, and Decode lends this package's strict YAML
// decoder to every other file format gitfleet reads.
//
// Every *.yaml / *.yml file outside dot-directories is exactly one object. A
// file that is not a valid object is an error, never skipped: skipping a file
// would read as deleting what it defined.
//
// The contracts here are the ones fixed in docs/DESIGN.md (Objects; Branches and
// files): identity is kind + metadata.name, never the file path.
//
// # Loading
//
// A Loader reads a Tree: a directory on disk (DirTree) or a git tree at a
// commit (package gitsource), through the same code. Object files are the
// *.yaml and *.yml files (extension in any letter case) under the Loader's
// directory, except hidden ones: a file or directory whose name starts with
// "." and everything below it (.github/, .draft.yaml) is ignored, like any
// file with another extension. Symlinks and submodules under the directory
// are errors wherever they are (git modes 120000 and 160000; a symlink on
// disk is never followed), since a link could hide or duplicate objects.
//
// A tree without a single object file under the Loader's directory (or
// under the root) is rejected, with one error naming the directory, for
// every reader alike: validate, the controller and plan. Hidden files and
// files of other kinds (README.md, .gitfleet/schema.json) do not count, so
// a directory renamed, moved or mistyped, or emptied by mistake, never
// reads as "delete every VM and volume". To delete every VM, delete the VM
// files and keep the Host files.
// Parsed files are cached by path and content (the git blob hash, or the
// sha256 of a file on disk): a reload after a one-file change parses one
// file, then runs the cross-object checks over the whole fleet again.
//
// Load reports every error at once, sorted by file and line, as an
// ErrorList of *Error values formatted FILE:LINE:COL: FIELD: message. An
// ErrorList matches ErrInvalid; any other error from Load is a failure to
// read the tree and says nothing about its content.
//
// # Profiles
//
// A VM that names a Profile (spec.profile) has as its spec the profile's
// spec with its own written over it: see Profile for the three rules. The
// merge is of YAML nodes, so the effective spec is decoded and checked
// like any VM file, each error at the file, line and column of the value
// that won; Fleet holds effective specs only, which is what snapshots
// carry. ExplainVM says where each field of one came from.
//
// # Strict decoding
//
// Object files are decoded from the YAML node tree by the yaml struct tags
// of the types in this package, and nothing is coerced. Decode applies the
// same rules to any other file gitfleet reads (a snapshot, a status file,
// a ledger in YAML, a configuration file) with that file's own types, size
// bound and words for the document as a whole, and returns a Document for
// the checks that follow (Required, Name, Errorf); Encode writes what
// Decode reads back. The rules:
//
//   - A field that is not in the schema is an error (with a "did you mean"
//     when a known field is close); so is a key written twice in a mapping.
//   - A string field takes only a YAML string. A plain scalar that YAML reads
//     as another type is rejected with advice to quote it, never kept: 007
//     and 1_000 are integers, 1e3, 1.10 and .inf are floats, true is a
//     boolean, ~ and an empty value are null. The words yes, no, on and off
//     are strings in YAML 1.2 and are kept as that text. Rejecting rather
//     than keeping the literal text is the safer choice: "version: 1.10"
//     could have been meant as a number by one reader and as text by
//     another, and a quote settles it in review.
//   - An integer field takes only a plain decimal integer (42, -1): no
//     quotes, floats, booleans, 0x/0o prefixes, leading zeros or
//     underscores. A boolean takes only true or false.
//   - An empty value (null) of a field is the same as leaving the field
//     out; a required field left out or empty is reported as missing. In a
//     list or a map an empty value is a type error.
//   - Anchors (&a), aliases (*a) and merge keys (<<) are rejected wherever
//     the decoder meets them, as are explicit tags (!!str). The parser
//     builds aliases as references and never expands them, so an
//     alias-expansion bomb costs no more than its size, which MaxFileSize
//     (1 MiB) bounds, as it bounds the time and memory of any one file.
//   - A file holds exactly one YAML document that is a mapping. A file with
//     no document (empty, only comments, only "---") or with a second
//     non-empty document is an error; a trailing "---" is not.
//   - A UTF-8 byte-order mark is accepted and stripped; CRLF line ends are
//     accepted and read as LF. UTF-16 (with or without a byte-order mark),
//     NUL bytes and invalid UTF-8 are rejected, with a message that says so.
//   - A tab used as indentation, before a key, a value or a list item, is
//     rejected with a message that says so, as YAML has it. Elsewhere a tab
//     is what YAML makes of it: a line of only spaces and tabs is blank, a
//     tab before a comment, after content, inside a flow ([a,<TAB>b]) or in
//     a block scalar's content (after its indentation) is kept or skipped
//     as YAML says. The YAML parser rejects some of these lines (a blank
//     line holding a tab, a comment indented by a tab); they are then read
//     as blank or as comments. Inside a block scalar (| or >) such a line
//     is content or ends the scalar, so there a tab left of the block's
//     indentation is an error, unless the line only ends the scalar and
//     reading it as blank changes nothing (not with keep chomping, |+).
//
// # Schema
//
// JSONSchema is generated from the same types the decoder fills, by their
// yaml tags; what a Go type cannot say (descriptions, limits) is in a
// schema method beside each type (see typeSchema, and docs/DESIGN.md,
// Objects, for how a new field gets into the schema).
//
// # Validation
//
// Each object is checked on its own (names are RFC 1123 labels of at most
// 63 characters; sha256 values are 64 lowercase hex digits; URLs use http,
// https or file:///absolute/path; vcpus, memoryMB, diskGB and sizeGB are
// within the Min/Max constants; power is running or stopped; a VM has an
// image, a kernel, or both), then against the others: a name is unique per
// kind (the error names both files), spec.host names a Host, a VM's network
// exists on its host, its volumes exist on the same host and belong to at
// most one VM, and per host the VMs' vcpus and memoryMB (stopped VMs
// included, as they may start at any time) fit the host's capacity where
// one is given. When two objects conflict, the one in the file that sorts
// first is the reference and the error is reported on the other. While some
// files are rejected, the "does not exist" and capacity checks are skipped:
// the rejected files may define what they would miss.
package desired
