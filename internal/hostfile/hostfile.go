// Package hostfile is what the snapshots and status branches share: one
// file per host at hosts/<host>.yaml, whose VMs and volumes are lists of
// entries found by name (Entry). Each branch's owner (packages snapshots
// and status) exports it under its own name; nothing else uses this
// package.
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

// Entry returns the entry of list whose name (nameOf) is name, or nil: the
// lookup of a VM or a volume by name in a host's file on either branch.
// The pointer is into list.
func Entry[T any](list []T, name string, nameOf func(*T) string) *T {
	for i := range list {
		if nameOf(&list[i]) == name {
			return &list[i]
		}
	}
	return nil
}
