package desired

import (
	"os"
	"path/filepath"
	"testing"
)

// writeTree writes files (slash paths relative to the root) into a fresh
// temporary directory and returns it.
func writeTree(t testing.TB, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const (
	sumA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	sumB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// goodFleet is a small valid fleet: two hosts, three VMs, one volume.
var goodFleet = map[string]string{
	"hosts/hv-a.yaml": `apiVersion: gitfleet.dev/v1alpha1
kind: Host
metadata: {name: hv-a}
spec:
  capacity: {vcpus: 8, memoryMB: 16384}
  networks: {lan: {bridge: br0}}
`,
	"hosts/hv-b.yml": `apiVersion: gitfleet.dev/v1alpha1
kind: Host
metadata:
  name: hv-b
spec: {}
`,
	"vms/web-01.yaml": `apiVersion: gitfleet.dev/v1alpha1
kind: VM
metadata:
  name: web-01
  labels: {team: web}
spec:
  host: hv-a
  vcpus: 2
  memoryMB: 2048
  diskGB: 20
  image:
    url: https://example.org/images/debian-12.qcow2
    sha256: ` + sumA + `
  network: lan
  volumes: [web-01-data]
  cloudInit:
    sshAuthorizedKeys: ["ssh-ed25519 AAAAC3Nza test"]
    userData: |
      #cloud-config
      packages: [nginx]
`,
	"vms/web-02.yaml": `apiVersion: gitfleet.dev/v1alpha1
kind: VM
metadata: {name: web-02}
spec:
  host: hv-a
  vcpus: 1
  memoryMB: 512
  diskGB: 10
  power: stopped
  image: {url: "file:///var/lib/images/debian.qcow2", sha256: ` + sumB + `}
`,
	"vms/kernel-01.yaml": `apiVersion: gitfleet.dev/v1alpha1
kind: VM
metadata: {name: kernel-01}
spec:
  host: hv-b
  vcpus: 1
  memoryMB: 256
  diskGB: 1
  kernel:
    url: http://boot.example.org/vmlinuz
    sha256: ` + sumA + `
    initrd: {url: http://boot.example.org/initrd, sha256: ` + sumB + `}
    cmdline: "console=ttyS0"
`,
	"volumes/web-01-data.yaml": `apiVersion: gitfleet.dev/v1alpha1
kind: Volume
metadata: {name: web-01-data}
spec: {host: hv-a, sizeGB: 50}
`,
	"README.md":          "# not an object\n",
	".github/ci.yaml":    "not: an object\n",
	"scripts/run.sh":     "#!/bin/sh\n",
	".hidden-notes.yaml": "- ignored\n",
}

// withFiles returns a copy of m with the changes applied; an empty value
// removes the file.
func withFiles(m map[string]string, changes map[string]string) map[string]string {
	out := make(map[string]string, len(m)+len(changes))
	for k, v := range m {
		out[k] = v
	}
	for k, v := range changes {
		if v == "" {
			delete(out, k)
			continue
		}
		out[k] = v
	}
	return out
}
