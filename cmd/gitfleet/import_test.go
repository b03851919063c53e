package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

const importHost = "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec:\n  networks:\n    default: {nat: {cidr: 10.77.0.0/24}}\n"

// importFixture is a fleet repository with Host hv-a (network
// "default"), a qcow2 disk made outside gitfleet, and the virt-manager
// XML of the domain that runs it (edit applied to the XML).
type importFixture struct {
	repo, disk, xml, state, hash string
}

func newImportFixture(t *testing.T, host string, edit func(string) string) importFixture {
	t.Helper()
	gittest.NeedGit(t)
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not installed (qemu-utils)")
	}
	f := importFixture{repo: gittest.NewBare(t)}
	gittest.Commit(t, f.repo, gittest.Edit{Branch: "main", Write: map[string]string{"fleet/hosts/hv-a.yaml": host}})
	work := t.TempDir()
	f.disk = filepath.Join(work, "libvirt", "images", "web-01.qcow2")
	f.state = filepath.Join(work, "state")
	os.MkdirAll(filepath.Dir(f.disk), 0o755)
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", f.disk, "1G").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	f.hash = fileSHA256(t, f.disk)
	x, err := os.ReadFile("../../adopt/testdata/web-01.xml")
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.ReplaceAll(string(x), "@DISK@", f.disk)
	if edit != nil {
		doc = edit(doc)
	}
	f.xml = filepath.Join(work, "web-01.xml")
	os.WriteFile(f.xml, []byte(doc), 0o644)
	return f
}

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func (f importFixture) args(extra ...string) []string {
	return append([]string{"import", "--libvirt-xml", f.xml, "--host", "hv-a", "--repo", f.repo, "--path", "fleet",
		"--stage", "--state-dir", f.state}, extra...)
}

// untouched fails unless the disk is at its path, byte for byte as it
// was, and nothing is staged.
func (f importFixture) untouched(t *testing.T) {
	t.Helper()
	if got := fileSHA256(t, f.disk); got != f.hash {
		t.Errorf("the disk changed: sha256 %s, was %s", got, f.hash)
	}
	if left, _ := filepath.Glob(filepath.Join(f.state, "adopt", "*", "*")); len(left) > 0 {
		t.Errorf("staged files left: %v", left)
	}
}

// TestImportLibvirtDomain: the VM file lands on a new branch above main
// (main unmoved), names no host path and keeps the MAC; the disk is
// renamed into the agent's state directory unchanged.
func TestImportLibvirtDomain(t *testing.T) {
	f := newImportFixture(t, importHost, nil)
	mainTip := gittest.Rev(t, f.repo, "main")
	code, out := runCLI(t, f.args()...)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if gittest.Rev(t, f.repo, "main") != mainTip || gittest.Rev(t, f.repo, "import/web-01~1") != mainTip {
		t.Error("main moved, or the branch is not one commit on main")
	}
	vm := gittest.Show(t, f.repo, "import/web-01", "fleet/vms/web-01.yaml")
	for _, want := range []string{`mac: "52:54:00:6b:3c:9a"`, "rootDisk:\n    adopt: true", "network: default", "not expressible", "graphics[0] type=spice"} {
		if !strings.Contains(vm, want) {
			t.Errorf("the VM file lacks %q:\n%s", want, vm)
		}
	}
	if strings.Contains(vm, filepath.Dir(f.disk)) || strings.Contains(vm, f.state) || strings.Contains(vm, filepath.Dir(f.xml)) {
		t.Errorf("the VM file names a host path:\n%s", vm)
	}
	if msg := gittest.Git(t, f.repo, "log", "-1", "--format=%B", "import/web-01"); strings.Contains(msg, filepath.Dir(f.disk)) || !strings.Contains(msg, "spec.mac") {
		t.Errorf("the commit message names a host path or lacks the report:\n%s", msg)
	}
	staged := filepath.Join(f.state, "adopt", "web-01", "root.qcow2")
	if fileSHA256(t, staged) != f.hash {
		t.Error("the staged disk is not the disk")
	}
	if _, err := os.Stat(f.disk); !os.IsNotExist(err) || !strings.Contains(out, "renamed on one filesystem") {
		t.Errorf("want a rename (the old path gone): stat %v, output:\n%s", err, out)
	}
}

// TestImportStageAgain: --stage without --repo renames the disk; a run
// again, with --repo, finds the original gone and the disk staged, says
// so, leaves it where it is and writes the branch.
func TestImportStageAgain(t *testing.T) {
	f := newImportFixture(t, importHost, nil)
	if code, out := runCLI(t, "import", "--libvirt-xml", f.xml, "--host", "hv-a", "--stage", "--state-dir", f.state); code != 0 {
		t.Fatalf("first --stage: exit %d:\n%s", code, out)
	}
	staged := filepath.Join(f.state, "adopt", "web-01", "root.qcow2")
	code, out := runCLI(t, f.args()...)
	if code != 0 || !strings.Contains(out, "already staged at "+staged) {
		t.Fatalf("again: exit %d, want 0 saying %q:\n%s", code, "already staged at "+staged, out)
	}
	if fileSHA256(t, staged) != f.hash {
		t.Error("the staged disk changed")
	}
	if vm := gittest.Show(t, f.repo, "import/web-01", "fleet/vms/web-01.yaml"); !strings.Contains(vm, "diskGB: 1") || strings.Contains(vm, f.state) {
		t.Errorf("the VM file lacks its disk size or names the state directory:\n%s", vm)
	}
}

// TestImportRefusals: whatever stops an import — the original runs, a
// field would be lost, the file does not validate, the branch cannot be
// written after the disk was staged — leaves the disk exactly as it was,
// where it was.
func TestImportRefusals(t *testing.T) {
	tests := []struct {
		name  string
		host  string
		edit  func(string) string
		setup func(t *testing.T, f importFixture)
		want  string // in the output
	}{
		{"libvirt runs it", importHost, func(s string) string {
			return strings.Replace(s, "<domain type='kvm'>", "<domain type='kvm' id='3'>", 1)
		}, nil, ""},
		{"a TPM blocks: its state is lost", importHost, func(s string) string {
			return strings.Replace(s, "</devices>", "<tpm model='tpm-crb'><backend type='emulator' version='2.0'/></tpm></devices>", 1)
		}, nil, "mapped with loss, blocks"},
		{"no such network on the host", "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec: {}\n", nil, nil, "fleet/vms/web-01.yaml:"},
		{"a VM of that name is in the fleet", importHost, nil, func(t *testing.T, f importFixture) {
			gittest.Commit(t, f.repo, gittest.Edit{Branch: "main", Write: map[string]string{"fleet/vms/web-01.yaml": "apiVersion: gitfleet.dev/v1alpha1\nkind: VM\nmetadata: {name: web-01}\nspec: {host: hv-a, vcpus: 1, memoryMB: 128}\n"}})
		}, "fleet/vms/web-01.yaml: in the fleet at main already"},
		{"a VM of that name in another file", importHost, nil, func(t *testing.T, f importFixture) {
			gittest.Commit(t, f.repo, gittest.Edit{Branch: "main", Write: map[string]string{"fleet/vms/web.yaml": "apiVersion: gitfleet.dev/v1alpha1\nkind: VM\nmetadata: {name: web-01}\nspec: {host: hv-a, vcpus: 1, memoryMB: 128}\n"}})
		}, "fleet/vms/web.yaml"},
		{"branch exists: write fails after staging", importHost, nil, func(t *testing.T, f importFixture) {
			gittest.Commit(t, f.repo, gittest.Edit{Branch: "import/web-01", Write: map[string]string{"x": "y"}})
		}, "put the disks back"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newImportFixture(t, tt.host, tt.edit)
			if tt.setup != nil {
				tt.setup(t, f)
			}
			code, out := runCLI(t, f.args()...)
			if code != 1 || !strings.Contains(out, tt.want) {
				t.Errorf("exit %d, want 1 with %q in:\n%s", code, tt.want, out)
			}
			f.untouched(t)
		})
	}
}

// TestImportBareDisk: a disk with its sizes on the command line; without
// --repo and --stage the VM file is printed and nothing moves.
func TestImportBareDisk(t *testing.T) {
	f := newImportFixture(t, importHost, nil)
	code, out := runCLI(t, "import", "--disk", f.disk, "--name", "db-01", "--cpus", "2", "--memory", "256", "--mac", "52:54:00:aa:bb:cc", "--host", "hv-a")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{"name: db-01", "vcpus: 2", "memoryMB: 256", "diskGB: 1", `mac: "52:54:00:aa:bb:cc"`, "adopt: true"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	f.untouched(t)
	if code, _ := runCLI(t, "import", "--disk", f.disk, "--host", "hv-a"); code != 2 {
		t.Errorf("--disk without sizes: exit %d, want 2", code)
	}
}

// TestImportWithADataDisk: a second, raw disk of the domain becomes a
// Volume (its file on the branch, the VM naming it) staged into the
// agent's volumes directory unchanged; when staging it fails after the
// root disk was staged (something is at its place already), the root disk
// is put back and both disks are as they were.
func TestImportWithADataDisk(t *testing.T) {
	withData := func(data string) func(string) string {
		return func(s string) string {
			return strings.Replace(s, "<controller type='usb'", "<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='"+data+
				"'/><target dev='vdb' bus='virtio'/></disk><controller type='usb'", 1)
		}
	}
	setup := func(t *testing.T) (importFixture, string, string) {
		data := filepath.Join(t.TempDir(), "web-01-data.img")
		f := newImportFixture(t, importHost, withData(data))
		// The data disk lives beside the root disk, on its filesystem.
		moved := filepath.Join(filepath.Dir(f.disk), "web-01-data.img")
		if err := os.WriteFile(moved, append([]byte("guest data"), make([]byte, 1<<20)...), 0o644); err != nil {
			t.Fatal(err)
		}
		x, _ := os.ReadFile(f.xml)
		os.WriteFile(f.xml, []byte(strings.ReplaceAll(string(x), data, moved)), 0o644)
		return f, moved, fileSHA256(t, moved)
	}
	t.Run("adopted as a volume", func(t *testing.T) {
		f, data, hash := setup(t)
		code, out := runCLI(t, f.args()...)
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		vol := gittest.Show(t, f.repo, "import/web-01", "fleet/volumes/web-01-vdb.yaml")
		vm := gittest.Show(t, f.repo, "import/web-01", "fleet/vms/web-01.yaml")
		if !strings.Contains(vol, "kind: Volume") || !strings.Contains(vol, "sizeGB: 1") || !strings.Contains(vm, "volumes:\n    - web-01-vdb") {
			t.Errorf("volume file:\n%s\nVM file:\n%s", vol, vm)
		}
		if got := fileSHA256(t, filepath.Join(f.state, "volumes", "web-01-vdb")); got != hash {
			t.Error("the staged volume is not the data disk")
		}
		if _, err := os.Stat(data); !os.IsNotExist(err) {
			t.Errorf("the data disk was not renamed: %v", err)
		}
	})
	t.Run("a failure staging it puts the root disk back", func(t *testing.T) {
		f, data, hash := setup(t)
		taken := filepath.Join(f.state, "volumes", "web-01-vdb")
		os.MkdirAll(filepath.Dir(taken), 0o700)
		os.WriteFile(taken, []byte("someone else's"), 0o600)
		code, out := runCLI(t, f.args()...)
		if code != 1 {
			t.Fatalf("exit %d, want 1:\n%s", code, out)
		}
		f.untouched(t)
		if fileSHA256(t, data) != hash {
			t.Error("the data disk changed or moved")
		}
		if b, _ := os.ReadFile(taken); string(b) != "someone else's" {
			t.Error("what was at the volume's place was replaced")
		}
		if err := exec.Command("git", "-C", f.repo, "rev-parse", "--verify", "--quiet", "refs/heads/import/web-01").Run(); err == nil {
			t.Error("the branch was written")
		}
	})
}
