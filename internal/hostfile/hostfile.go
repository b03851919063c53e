// Package hostfile is the layout the snapshots and status branches share:
// one file per host at hosts/<host>.yaml. Each branch's owner (packages
// snapshots and status) exports it under its own name; nothing else uses
// this package.
package hostfile

import (
	"path"
	"strings"
)

// Path is host's file: hosts/<host>.yaml.
func Path(host string) string { return "hosts/" + host + ".yaml" }

// Host returns the host of a path hosts/<host>.yaml, and false for any
// other path (a file outside hosts/, in a directory below it, not ending
// in .yaml, or named just .yaml).
func Host(p string) (string, bool) {
	dir, file := path.Split(p)
	if dir != "hosts/" || !strings.HasSuffix(file, ".yaml") {
		return "", false
	}
	host := strings.TrimSuffix(file, ".yaml")
	return host, host != ""
}
