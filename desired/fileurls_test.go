package desired

import (
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
