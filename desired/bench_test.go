package desired

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	benchHosts = 1000
	benchVMs   = 10000
)

func benchHostFile(i int) string {
	return fmt.Sprintf(`apiVersion: gitfleet.dev/v1alpha1
kind: Host
metadata:
  name: hv-%04d
  labels: {rack: r%d}
spec:
  capacity: {vcpus: 64, memoryMB: 262144}
  networks:
    lan: {bridge: br0}
`, i, i%40)
}

func benchVMFile(i, vcpus int) string {
	return fmt.Sprintf(`# yaml-language-server: $schema=../.gitfleet/schema.json
apiVersion: gitfleet.dev/v1alpha1
kind: VM
metadata:
  name: vm-%05d
  labels: {team: t%d}
spec:
  host: hv-%04d
  vcpus: %d
  memoryMB: 2048
  diskGB: 20
  image:
    url: https://cloud-images.ubuntu.com/releases/noble/release-20250704/ubuntu-24.04-server-cloudimg-amd64.img
    sha256: f1652d29d497fb7c623433705c9fca6525d1311b11294a0f495eed55c7639d1f
  network: lan
  cloudInit:
    sshAuthorizedKeys: ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBenchmarkKey%05d ops@example.org"]
    userData: |
      #cloud-config
      packages: [nginx]
`, i, i%50, i%benchHosts, vcpus, i)
}

// benchFiles is a fleet of benchVMs VM files and benchHosts host files.
func benchFiles() map[string]string {
	files := make(map[string]string, benchHosts+benchVMs)
	for i := range benchHosts {
		files[fmt.Sprintf("hosts/hv-%04d.yaml", i)] = benchHostFile(i)
	}
	for i := range benchVMs {
		files[fmt.Sprintf("vms/%02d/vm-%05d.yaml", i%100, i)] = benchVMFile(i, 2)
	}
	return files
}

func writeBenchTree(b *testing.B) string {
	b.Helper()
	root := b.TempDir()
	for p, c := range benchFiles() {
		full := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return root
}

// BenchmarkLoadDir loads 10,000 VM files and 1,000 host files from a
// directory with a fresh Loader each time: read, parse, validate, cross
// check. Goal: under 1 s and 200 MB.
func BenchmarkLoadDir(b *testing.B) {
	root := writeBenchTree(b)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		f, err := NewLoader("").Load(DirTree(root))
		if err != nil {
			b.Fatal(err)
		}
		if len(f.VMs) != benchVMs || len(f.Hosts) != benchHosts {
			b.Fatalf("loaded %d VMs, %d hosts", len(f.VMs), len(f.Hosts))
		}
	}
}

// BenchmarkReloadDirOneFileChanged reloads the same directory after one
// file changed, with a warm Loader: every file is still read and hashed
// (a directory gives no content IDs), one is parsed.
func BenchmarkReloadDirOneFileChanged(b *testing.B) {
	root := writeBenchTree(b)
	l := NewLoader("")
	if _, err := l.Load(DirTree(root)); err != nil {
		b.Fatal(err)
	}
	p := filepath.Join(root, "vms", "07", "vm-00007.yaml")
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		i++
		if err := os.WriteFile(p, []byte(benchVMFile(7, 1+i%2)), 0o644); err != nil {
			b.Fatal(err)
		}
		f, err := l.Load(DirTree(root))
		if err != nil {
			b.Fatal(err)
		}
		if f.VMs["vm-00007"].Spec.VCPUs != 1+i%2 {
			b.Fatal("the change was not seen")
		}
	}
}

// BenchmarkReloadTreeOneFileChanged reloads a git-like tree (content IDs
// given, as gitsource gives blob hashes) after one file changed: one file
// is read and parsed, the rest come from the cache.
func BenchmarkReloadTreeOneFileChanged(b *testing.B) {
	files := benchFiles()
	l := NewLoader("")
	if _, err := l.Load(newMemTree(files, nil)); err != nil {
		b.Fatal(err)
	}
	trees := [2]*memTree{}
	for v := range trees {
		changed := withFiles(files, map[string]string{"vms/07/vm-00007.yaml": benchVMFile(7, 1+v)})
		trees[v] = newMemTree(changed, nil)
	}
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		i++
		f, err := l.Load(trees[i%2])
		if err != nil {
			b.Fatal(err)
		}
		if f.VMs["vm-00007"].Spec.VCPUs != 1+i%2 {
			b.Fatal("the change was not seen")
		}
	}
}

// TestBenchFleetIsValid keeps the benchmark honest: its fleet loads.
func TestBenchFleetIsValid(t *testing.T) {
	if testing.Short() {
		t.Skip("loads 11,000 files")
	}
	files := benchFiles()
	f, err := NewLoader("").Load(newMemTree(files, nil))
	if err != nil {
		t.Fatal(strings.SplitN(err.Error(), "\n", 2)[0])
	}
	if len(f.VMs) != benchVMs || len(f.Hosts) != benchHosts {
		t.Fatalf("loaded %d VMs, %d hosts", len(f.VMs), len(f.Hosts))
	}
}

// BenchmarkParseVMFile decodes and checks one VM file of the fleet above.
func BenchmarkParseVMFile(b *testing.B) {
	data := []byte(benchVMFile(7, 2))
	b.ReportAllocs()
	for b.Loop() {
		if _, errs := parseFile("vm.yaml", data); errs != nil {
			b.Fatal(errs)
		}
	}
}

// benchProfileFile is the profile of benchProfiledFiles' VMs.
func benchProfileFile(memoryMB int) string {
	return fmt.Sprintf(`apiVersion: gitfleet.dev/v1alpha1
kind: Profile
metadata: {name: web}
spec:
  vcpus: 2
  memoryMB: %d
  diskGB: 20
  image:
    url: https://cloud-images.ubuntu.com/releases/noble/release-20250704/ubuntu-24.04-server-cloudimg-amd64.img
    sha256: f1652d29d497fb7c623433705c9fca6525d1311b11294a0f495eed55c7639d1f
  network: lan
  cloudInit:
    userData: |
      #cloud-config
      packages: [nginx]
`, memoryMB)
}

func benchProfiledVMFile(i, vcpus int) string {
	return fmt.Sprintf(`apiVersion: gitfleet.dev/v1alpha1
kind: VM
metadata:
  name: vm-%05d
  labels: {team: t%d}
spec:
  profile: web
  host: hv-%04d
  vcpus: %d
  cloudInit:
    sshAuthorizedKeys: ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBenchmarkKey%05d ops@example.org"]
`, i, i%50, i%benchHosts, vcpus, i)
}

// benchProfiledFiles is benchFiles' fleet with every VM on one profile:
// the same effective specs (but memoryMB), from smaller VM files.
func benchProfiledFiles(memoryMB int) map[string]string {
	files := make(map[string]string, benchHosts+benchVMs+1)
	for i := range benchHosts {
		files[fmt.Sprintf("hosts/hv-%04d.yaml", i)] = benchHostFile(i)
	}
	for i := range benchVMs {
		files[fmt.Sprintf("vms/%02d/vm-%05d.yaml", i%100, i)] = benchProfiledVMFile(i, 2)
	}
	files["profiles/web.yaml"] = benchProfileFile(memoryMB)
	return files
}

// BenchmarkLoadProfiled is a fresh Loader's Load of 10,000 VMs on one
// profile (a git-like tree): each VM parsed, merged with the profile and
// its effective spec decoded and checked. Compare BenchmarkLoadTree.
func BenchmarkLoadProfiled(b *testing.B) {
	tree := newMemTree(benchProfiledFiles(2048), nil)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NewLoader("").Load(tree); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLoadTree is BenchmarkLoadProfiled's fleet written out, every
// VM file whole.
func BenchmarkLoadTree(b *testing.B) {
	tree := newMemTree(benchFiles(), nil)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NewLoader("").Load(tree); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReloadProfileChanged reloads the profiled fleet after its
// profile changed: the one file is parsed, and the 10,000 effective
// specs are decoded again.
func BenchmarkReloadProfileChanged(b *testing.B) {
	l := NewLoader("")
	trees := [2]*memTree{newMemTree(benchProfiledFiles(2048), nil), newMemTree(benchProfiledFiles(4096), nil)}
	if _, err := l.Load(trees[0]); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		i++
		f, err := l.Load(trees[i%2])
		if err != nil {
			b.Fatal(err)
		}
		if f.VMs["vm-00007"].Spec.MemoryMB != 2048*(1+i%2) {
			b.Fatal("the change was not seen")
		}
	}
}

// BenchmarkReloadProfiledOneFileChanged reloads the profiled fleet after
// one VM file changed: one file parsed, one effective spec decoded.
func BenchmarkReloadProfiledOneFileChanged(b *testing.B) {
	files := benchProfiledFiles(2048)
	l := NewLoader("")
	if _, err := l.Load(newMemTree(files, nil)); err != nil {
		b.Fatal(err)
	}
	trees := [2]*memTree{}
	for v := range trees {
		trees[v] = newMemTree(withFiles(files, map[string]string{"vms/07/vm-00007.yaml": benchProfiledVMFile(7, 1+v)}), nil)
	}
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		i++
		f, err := l.Load(trees[i%2])
		if err != nil {
			b.Fatal(err)
		}
		if f.VMs["vm-00007"].Spec.VCPUs != 1+i%2 {
			b.Fatal("the change was not seen")
		}
	}
}
