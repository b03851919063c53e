package desired

import (
	"fmt"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// CloudInitUserWarnings lists the VMs of f whose spec gives
// cloudInit.sshAuthorizedKeys and whose #cloud-config user-data has a
// `users:` list without "default", as "FILE:LINE:COL: vm NAME: …" at
// the userData field. The keys reach the guest through the seed's
// meta-data, which cloud-init gives to the default user; a users list
// without "default" makes no default user, so cloud-init puts the keys
// on root, whose login it disables ("Please login as the user \"NONE\""):
// the VM is ready and nobody can log in. Other user-data formats, and
// encryptedUserData (sealed to its host), are not read. Sorted by file,
// line and column.
func (f *Fleet) CloudInitUserWarnings() []string {
	type warning struct {
		origin Origin
		text   string
	}
	var ws []warning
	for _, vm := range f.VMs {
		ci := vm.Spec.CloudInit
		if ci == nil || len(ci.SSHAuthorizedKeys) == 0 || !usersWithoutDefault(ci.UserData) {
			continue
		}
		at := vm.FieldOrigin("spec.cloudInit.userData")
		ws = append(ws, warning{at, fmt.Sprintf("%s:%d:%d: vm %s: spec.cloudInit.userData's users: list lacks \"default\": cloud-init creates no default user, so spec.cloudInit.sshAuthorizedKeys land on root, whose login it disables (\"Please login as the user NONE\"); add \"default\" to users, or give the keys in users[].ssh_authorized_keys",
			at.File, at.Line, at.Col, vm.Metadata.Name)})
	}
	sort.Slice(ws, func(i, j int) bool {
		a, b := ws[i].origin, ws[j].origin
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Col < b.Col
	})
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.text
	}
	return out
}

// usersWithoutDefault reports whether userData is a #cloud-config whose
// top-level users is a list without the entry "default" (an empty list
// included). Validation already refused a #cloud-config that does not
// parse.
func usersWithoutDefault(userData string) bool {
	if !strings.HasPrefix(userData, "#cloud-config\n") && strings.TrimRight(userData, "\r\n") != "#cloud-config" {
		return false
	}
	var root yaml.Node
	if yaml.Unmarshal([]byte(userData), &root) != nil || len(root.Content) != 1 || root.Content[0].Kind != yaml.MappingNode {
		return false
	}
	var users *yaml.Node
	top := root.Content[0].Content
	for i := 0; i+1 < len(top); i += 2 {
		if top[i].Value == "users" {
			users = top[i+1]
		}
	}
	if users == nil || users.Kind != yaml.SequenceNode {
		return false
	}
	for _, u := range users.Content {
		if u.Kind == yaml.ScalarNode && u.Value == "default" {
			return false
		}
	}
	return true
}
