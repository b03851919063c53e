package desired

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
)

func TestLoadDirGoodFleet(t *testing.T) {
	f, err := LoadDir(writeTree(t, goodFleet))
	if err != nil {
		t.Fatalf("LoadDir: %v", err)
	}
	if len(f.VMs) != 3 || len(f.Volumes) != 1 || len(f.Hosts) != 2 {
		t.Fatalf("got %d VMs, %d volumes, %d hosts; want 3, 1, 2", len(f.VMs), len(f.Volumes), len(f.Hosts))
	}
	web := f.VMs["web-01"]
	if web.Spec.Power != PowerRunning {
		t.Errorf("web-01 power = %q, want the default %q", web.Spec.Power, PowerRunning)
	}
	if web.Origin != (Origin{File: "vms/web-01.yaml", Line: 1, Col: 1}) {
		t.Errorf("web-01 origin = %+v", web.Origin)
	}
	if got := web.Spec.CloudInit.UserData; got != "#cloud-config\npackages: [nginx]\n" {
		t.Errorf("userData = %q", got)
	}
	if f.VMs["web-02"].Spec.Power != PowerStopped {
		t.Errorf("web-02 power = %q", f.VMs["web-02"].Spec.Power)
	}
	if k := f.VMs["kernel-01"].Spec.Kernel; k == nil || k.Initrd == nil || k.Cmdline != "console=ttyS0" {
		t.Errorf("kernel-01 kernel = %+v", k)
	}
	if c := f.Hosts["hv-a"].Spec.Capacity; c == nil || c.VCPUs != 8 || c.MemoryMB != 16384 {
		t.Errorf("hv-a capacity = %+v", c)
	}
}

func TestLoadDirErrorMatchesErrInvalid(t *testing.T) {
	_, err := LoadDir(writeTree(t, withFiles(goodFleet, map[string]string{
		"vms/web-02.yaml": "apiVersion: gitfleet.dev/v1alpha1\nkind: VM\n",
	})))
	var list ErrorList
	if !errors.As(err, &list) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v; want an ErrorList matching ErrInvalid", err)
	}
}

func TestLoadDirMissingDirectoryIsNotInvalid(t *testing.T) {
	_, err := LoadDir(t.TempDir() + "/absent")
	if err == nil || errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v; want a read error that is not ErrInvalid", err)
	}
}

// memTree is an in-memory Tree, as a git tree would present itself: every
// file has an ID derived from its content, and reads are counted.
type memTree struct {
	files   []File
	reads   *int
	walkErr error
}

func newMemTree(files map[string]string, reads *int) *memTree {
	t := &memTree{reads: reads}
	for p, content := range files {
		t.add(File{Path: p, Mode: Regular, Size: int64(len(content)), ID: "blob-" + fmt.Sprint(len(content)) + "-" + hashOf(content)}, content)
	}
	return t
}

func hashOf(s string) string { return string(SpecHash(VMSpec{Host: s})[:12]) }

// readsMu guards the read counters: the Loader reads files from several
// goroutines.
var readsMu sync.Mutex

func (t *memTree) add(f File, content string) {
	reads := t.reads
	f.Read = func() ([]byte, error) {
		if reads != nil {
			readsMu.Lock()
			*reads++
			readsMu.Unlock()
		}
		return []byte(content), nil
	}
	t.files = append(t.files, f)
}

func (t *memTree) Walk(fn func(File) error) error {
	for _, f := range t.files {
		if err := fn(f); err != nil {
			return err
		}
	}
	return t.walkErr
}

func TestLoaderRejectsLinksAndSubmodules(t *testing.T) {
	tree := newMemTree(goodFleet, nil)
	tree.add(File{Path: "vms/web-03.yaml", Mode: Symlink, ID: "l1"}, "web-01.yaml")
	tree.add(File{Path: "vendored", Mode: Submodule, ID: "c1"}, "")
	tree.add(File{Path: ".github/link", Mode: Symlink, ID: "l2"}, "x") // hidden: ignored
	_, err := NewLoader("").Load(tree)
	want := "vendored:1:1: submodules are not read; copy the objects into this repository, or remove the submodule\n" +
		"vms/web-03.yaml:1:1: symlinks are not followed; replace the link by the file it points to, or remove it"
	if err == nil || err.Error() != want {
		t.Fatalf("err =\n%v\nwant\n%s", err, want)
	}
}

func TestDirTreeReportsSymlinks(t *testing.T) {
	root := writeTree(t, goodFleet)
	if err := os.Symlink("web-01.yaml", filepath.Join(root, "vms", "web-03.yaml")); err != nil {
		t.Skipf("cannot create symlinks here: %v", err)
	}
	if err := os.Symlink("vms", filepath.Join(root, "more-vms")); err != nil {
		t.Fatal(err)
	}
	_, err := LoadDir(root)
	want := "more-vms:1:1: symlinks are not followed; replace the link by the file it points to, or remove it\n" +
		"vms/web-03.yaml:1:1: symlinks are not followed; replace the link by the file it points to, or remove it"
	if err == nil || err.Error() != want {
		t.Fatalf("err =\n%v\nwant\n%s", err, want)
	}
	// The root itself may be a symlink: it is what the caller named.
	link := filepath.Join(t.TempDir(), "fleet")
	if err := os.Symlink(writeTree(t, goodFleet), link); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadDir(link); err != nil {
		t.Fatalf("LoadDir(symlink to a fleet): %v", err)
	}
}

func TestLoaderDirectory(t *testing.T) {
	files := map[string]string{}
	for p, c := range goodFleet {
		files["fleet/"+p] = c
	}
	files["other/broken.yaml"] = "not: an object\n"
	files["fleetish/broken.yaml"] = "not: an object\n"
	for _, dir := range []string{"fleet", "fleet/", "./fleet"} {
		f, err := NewLoader(dir).Load(newMemTree(files, nil))
		if err != nil {
			t.Fatalf("Load(dir %q): %v", dir, err)
		}
		if got := f.VMs["web-01"].Origin.File; got != "fleet/vms/web-01.yaml" {
			t.Errorf("dir %q: origin %q; want the path from the tree root", dir, got)
		}
	}
	if _, err := NewLoader("").Load(newMemTree(files, nil)); !errors.Is(err, ErrInvalid) {
		t.Errorf("Load of the whole tree: err = %v; want the broken files rejected", err)
	}
	_, err := NewLoader("flet").Load(newMemTree(files, nil))
	if want := noObjectsUnder("flet"); err == nil || err.Error() != want {
		t.Errorf("Load of a missing directory: err = %v, want %s", err, want)
	}
}

// noObjectsUnder is the one error of a tree without objects under dir.
func noObjectsUnder(dir string) string {
	const why = "; a fleet without objects would delete every VM and volume, so it is refused " +
		"(to delete every VM and volume, delete their files and keep the Host files)"
	if dir == "" {
		return ".:1:1: no objects under the repository root: no *.yaml or *.yml file outside hidden directories" + why
	}
	return dir + ":1:1: no objects under \"" + dir + "\": the directory is missing or holds no *.yaml or *.yml file outside hidden directories" + why
}

// TestLoaderRefusesAFleetWithoutObjects pins that a tree with no object
// file under the directory is rejected, never read as "delete everything":
// hidden files, hidden directories and files of other kinds do not count.
// A fleet of Hosts alone is how every VM is deleted, and it loads.
func TestLoaderRefusesAFleetWithoutObjects(t *testing.T) {
	host := goodFleet["hosts/hv-b.yml"]
	tests := []struct {
		name  string
		dir   string
		files map[string]string
		want  string // the error, or "" for a fleet of one host
	}{
		{"empty tree at the root", "", nil, noObjectsUnder("")},
		{"root with only other files", "", map[string]string{
			"README.md": "# fleet\n", ".gitfleet/schema.json": "{}", ".github/workflows/ci.yml": "on: push\n", ".draft.yaml": host,
		}, noObjectsUnder("")},
		{"empty tree, directory", "fleet", nil, noObjectsUnder("fleet")},
		{"directory missing, objects elsewhere", "fleet", map[string]string{"moved/hv-b.yaml": host}, noObjectsUnder("fleet")},
		{"directory with a README", "fleet", map[string]string{"fleet/README.md": "empty for now\n"}, noObjectsUnder("fleet")},
		{"directory with only hidden files", "fleet", map[string]string{
			"fleet/.gitfleet/schema.json": "{}", "fleet/.keep": "", "fleet/.old/hv-b.yaml": host, "hv-b.yaml": host,
		}, noObjectsUnder("fleet")},
		{"directory with only a subdirectory of other files", "fleet", map[string]string{"fleet/vms/notes.txt": "moved\n"}, noObjectsUnder("fleet")},
		{"hosts alone at the root", "", map[string]string{"hv-b.yaml": host, "README.md": "x\n"}, ""},
		{"hosts alone in the directory", "fleet", map[string]string{"fleet/hosts/hv-b.yaml": host}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The same tree as a git tree would give it and on disk.
			trees := map[string]Tree{"memory": newMemTree(tc.files, nil), "disk": DirTree(writeTree(t, tc.files))}
			for kind, tree := range trees {
				f, err := NewLoader(tc.dir).Load(tree)
				if tc.want == "" {
					if err != nil || len(f.Hosts) != 1 || len(f.VMs)+len(f.Volumes) != 0 {
						t.Errorf("%s: Load = %v, %v; want a fleet of one host", kind, f, err)
					}
					continue
				}
				if f != nil || !errors.Is(err, ErrInvalid) || err.Error() != tc.want {
					t.Errorf("%s: Load = %v, err =\n%v\nwant\n%s", kind, f, err, tc.want)
				}
			}
		})
	}
}

func TestLoaderCachesByID(t *testing.T) {
	reads := 0
	l := NewLoader("")
	if _, err := l.Load(newMemTree(goodFleet, &reads)); err != nil {
		t.Fatal(err)
	}
	if reads != 6 {
		t.Fatalf("first load read %d files, want the 6 object files", reads)
	}
	reads = 0
	changed := withFiles(goodFleet, map[string]string{
		"vms/web-02.yaml": strings.Replace(goodFleet["vms/web-02.yaml"], "vcpus: 1", "vcpus: 2", 1),
	})
	f, err := l.Load(newMemTree(changed, &reads))
	if err != nil {
		t.Fatal(err)
	}
	if reads != 1 {
		t.Errorf("reload after a one-file change read %d files, want 1", reads)
	}
	if f.VMs["web-02"].Spec.VCPUs != 2 {
		t.Errorf("web-02 vcpus = %d after the change, want 2", f.VMs["web-02"].Spec.VCPUs)
	}
	// A cached file that was valid still takes part in the cross checks:
	// removing the host its VMs name is an error although no VM changed.
	reads = 0
	_, err = l.Load(newMemTree(withFiles(changed, map[string]string{"hosts/hv-b.yml": ""}), &reads))
	if reads != 0 || err == nil || !strings.Contains(err.Error(), `vms/kernel-01.yaml:5:9: spec.host: Host "hv-b" does not exist`) {
		t.Errorf("after removing hv-b: %d reads, err = %v", reads, err)
	}
}

func TestLoaderCachesDirectoriesByContent(t *testing.T) {
	root := writeTree(t, goodFleet)
	l := NewLoader("")
	first, err := l.Load(DirTree(root))
	if err != nil {
		t.Fatal(err)
	}
	again, err := l.Load(DirTree(root))
	if err != nil {
		t.Fatal(err)
	}
	if first.VMs["web-01"] != again.VMs["web-01"] {
		t.Errorf("an unchanged file was parsed again")
	}
	p := filepath.Join(root, "vms", "web-01.yaml")
	if err := os.WriteFile(p, []byte(strings.Replace(goodFleet["vms/web-01.yaml"], "vcpus: 2", "vcpus: 4", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	third, err := l.Load(DirTree(root))
	if err != nil {
		t.Fatal(err)
	}
	if third.VMs["web-01"].Spec.VCPUs != 4 || third.VMs["web-02"] != first.VMs["web-02"] {
		t.Errorf("after editing web-01: vcpus %d, web-02 reparsed %v", third.VMs["web-01"].Spec.VCPUs, third.VMs["web-02"] != first.VMs["web-02"])
	}
}

func TestLoaderTreeFailuresAreNotVerdicts(t *testing.T) {
	tree := newMemTree(goodFleet, nil)
	tree.walkErr = errors.New("object not found")
	_, err := NewLoader("").Load(tree)
	if err == nil || errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "object not found") {
		t.Errorf("walk failure: err = %v", err)
	}
	tree = newMemTree(goodFleet, nil)
	tree.files = append(tree.files, File{Path: "vms/lost.yaml", ID: "x", Read: func() ([]byte, error) { return nil, errors.New("blob missing") }})
	_, err = NewLoader("").Load(tree)
	if err == nil || errors.Is(err, ErrInvalid) || err.Error() != "read vms/lost.yaml: blob missing" {
		t.Errorf("read failure: err = %v", err)
	}
}

func TestLoaderRejectsLargeFilesUnread(t *testing.T) {
	tree := newMemTree(goodFleet, nil)
	tree.files = append(tree.files, File{Path: "vms/huge.yaml", ID: "h", Size: MaxFileSize + 1, Read: func() ([]byte, error) {
		t.Error("a file over the size limit was read")
		return nil, nil
	}})
	_, err := NewLoader("").Load(tree)
	if want := "vms/huge.yaml:1:1: file is 1048577 bytes; an object file may be at most 1048576 bytes (1 MiB)"; err == nil || err.Error() != want {
		t.Errorf("err = %v, want %s", err, want)
	}
}

func TestEncodingVariantsDecodeEqually(t *testing.T) {
	src := goodFleet["vms/web-01.yaml"]
	base, errs := parseFile("a.yaml", []byte(src))
	if errs != nil {
		t.Fatal(errs)
	}
	for name, variant := range map[string]string{
		"byte-order mark": "\xEF\xBB\xBF" + src,
		"CRLF":            strings.ReplaceAll(src, "\n", "\r\n"),
	} {
		got, errs := parseFile("a.yaml", []byte(variant))
		if errs != nil {
			t.Fatalf("%s: %v", name, errs)
		}
		if !reflect.DeepEqual(got.vm, base.vm) {
			t.Errorf("%s: decoded %+v, want %+v", name, got.vm, base.vm)
		}
	}
}
