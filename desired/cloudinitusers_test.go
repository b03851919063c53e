package desired

import (
	"strings"
	"testing"
)

// A VM given SSH keys whose #cloud-config users list lacks "default" is
// warned of at its userData's line; with "default", with no users list,
// without keys or in another format, nothing is said.
func TestCloudInitUserWarnings(t *testing.T) {
	const key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGRLEdvtTk0H1fhdbY0YvJ4wGIDsG1Xeeu8YK3MDpMnW ops@example.org"
	vmFile := func(name, keys, userData string) string {
		s := "apiVersion: gitfleet.dev/v1alpha1\nkind: VM\nmetadata: {name: " + name + "}\nspec:\n  host: hv-a\n  vcpus: 1\n  memoryMB: 512\n  diskGB: 4\n" +
			"  image: {url: \"https://images.example.org/debian.qcow2\", sha256: \"" + strings.Repeat("a", 64) + "\"}\n  cloudInit:\n"
		if keys != "" {
			s += "    sshAuthorizedKeys: [\"" + keys + "\"]\n"
		}
		if userData != "" {
			s += "    userData: |\n"
			for _, l := range strings.Split(strings.TrimRight(userData, "\n"), "\n") {
				s += "      " + l + "\n"
			}
		}
		return s
	}
	noDefault := "#cloud-config\nusers:\n  - name: ops\n    groups: sudo\n"
	files := map[string]string{
		"hosts/hv-a.yaml":    "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec: {}\n",
		"vms/nodefault.yaml": vmFile("nodefault", key, noDefault),
		"vms/empty.yaml":     vmFile("empty", key, "#cloud-config\nusers: []\n"),
		"vms/withdef.yaml":   vmFile("withdef", key, "#cloud-config\nusers:\n  - default\n  - name: ops\n"),
		"vms/nousers.yaml":   vmFile("nousers", key, "#cloud-config\npackages: [htop]\n"),
		"vms/nokeys.yaml":    vmFile("nokeys", "", noDefault),
		"vms/script.yaml":    vmFile("script", key, "#!/bin/sh\necho users:\n"),
	}
	f, err := LoadDir(writeTree(t, files))
	if err != nil {
		t.Fatal(err)
	}
	got := f.CloudInitUserWarnings()
	if len(got) != 2 {
		t.Fatalf("warnings = %q; want nodefault and empty", got)
	}
	if !strings.HasPrefix(got[0], "vms/empty.yaml:") || !strings.HasPrefix(got[1], "vms/nodefault.yaml:12:15:") ||
		!strings.Contains(got[1], "vm nodefault: spec.cloudInit.userData's users: list lacks \"default\"") ||
		!strings.Contains(got[1], "sshAuthorizedKeys land on root") {
		t.Errorf("warnings = %q", got)
	}
}
