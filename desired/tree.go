package desired

// FileMode is the kind of a tree entry, as git records it.
type FileMode int

// Entry kinds. Only Regular and Executable files may hold objects; a YAML
// path that is a Symlink or Submodule is an error (git modes 120000 and
// 160000; a symlink in a directory).
const (
	Regular FileMode = iota
	Executable
	Symlink
	Submodule
)

// File is one entry of a Tree.
type File struct {
	// Path is slash-separated and relative to the tree root.
	Path string
	Mode FileMode
	// Size in bytes.
	Size int64
	// ID identifies the content (a git blob hash); empty when unknown. A
	// Loader caches parsed objects by ID, so a one-file commit costs one
	// parse.
	ID string
	// Read returns the file's contents.
	Read func() ([]byte, error)
}

// Tree is what a fleet is loaded from: a directory on disk (DirTree) or a git
// tree at a commit (package gitsource). Walk calls fn once per non-directory
// entry, in any order; a non-nil error from fn stops the walk and is
// returned. An error of the tree itself (a missing object, an unreadable
// directory) is returned and never reads as a smaller tree.
type Tree interface {
	Walk(fn func(File) error) error
}
