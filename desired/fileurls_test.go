package desired

import (
	"fmt"
	"strings"
	"testing"
)

// A file:// URL warning points at the URL's own line and column, one
// warning per artifact, in file order.
func TestFileURLWarningsPointAtTheField(t *testing.T) {
	vm := `apiVersion: gitfleet.dev/v1alpha1
kind: VM
metadata: {name: web-01}
spec:
  host: hv-a
  vcpus: 1
  memoryMB: 128
  diskGB: 1
  image:
    url: file:///srv/images/base.qcow2
    sha256: ` + strings.Repeat("a", 64) + `
  kernel:
    url: https://images.example/vmlinuz
    sha256: ` + strings.Repeat("b", 64) + `
    initrd: {url: "file:///srv/images/initrd.img", sha256: ` + strings.Repeat("c", 64) + `}
`
	host := "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec: {}\n"
	f, err := LoadDir(writeTree(t, map[string]string{"vms/web-01.yaml": vm, "hosts/hv-a.yaml": host}))
	if err != nil {
		t.Fatal(err)
	}
	got := f.FileURLWarnings()
	want := []string{
		"vms/web-01.yaml:10:10: vm web-01: spec.image.url is a file:// URL (a path on the host): agents refuse it unless their artifacts.fileRoots allow its directory",
		"vms/web-01.yaml:15:19: vm web-01: spec.kernel.initrd.url is a file:// URL (a path on the host): agents refuse it unless their artifacts.fileRoots allow its directory",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("warnings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A host over its capacity names the VMs that ask for it, largest first,
// each at its file, and no more than maxAskers of them.
func TestCapacityOverflowNamesTheVMs(t *testing.T) {
	files := map[string]string{"hosts/hv-a.yaml": "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec: {capacity: {vcpus: 4}}\n"}
	for i := 1; i <= 12; i++ {
		files[fmt.Sprintf("vms/vm-%02d.yaml", i)] = fmt.Sprintf("apiVersion: gitfleet.dev/v1alpha1\nkind: VM\nmetadata: {name: vm-%02d}\nspec:\n  host: hv-a\n  vcpus: %d\n  memoryMB: 128\n  diskGB: 1\n  kernel: {url: https://images.example/k, sha256: %s}\n",
			i, 1+i%3, strings.Repeat("a", 64))
	}
	_, err := LoadDir(writeTree(t, files))
	want := "hosts/hv-a.yaml:4:26: spec.capacity.vcpus: the 12 VMs on this host ask for 24 vCPUs in all, more than its capacity of 4: " +
		"vm-02 (vms/vm-02.yaml:3:18) asks 3, vm-05 (vms/vm-05.yaml:3:18) asks 3, vm-08 (vms/vm-08.yaml:3:18) asks 3, vm-11 (vms/vm-11.yaml:3:18) asks 3, " +
		"vm-01 (vms/vm-01.yaml:3:18) asks 2, vm-04 (vms/vm-04.yaml:3:18) asks 2, vm-07 (vms/vm-07.yaml:3:18) asks 2, vm-10 (vms/vm-10.yaml:3:18) asks 2, " +
		"vm-03 (vms/vm-03.yaml:3:18) asks 1, vm-06 (vms/vm-06.yaml:3:18) asks 1, and 2 more"
	if err == nil || err.Error() != want {
		t.Errorf("got  %v\nwant %s", err, want)
	}
}
