package desired

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/testsupport/golden"
)

// fleet40 is a fleet of 40 VMs on one profile (testdata/profiles/fleet40):
// each VM file names profile web and its host, and nothing else.
var fleet40 = filepath.Join("testdata", "profiles", "fleet40")

// webProfileSpec is the spec of testdata/profiles/fleet40/profiles/web.yaml,
// as a VM file writes it out in full (four-space indented under spec).
const webProfileSpec = `  vcpus: 2
  memoryMB: 2048
  diskGB: 20
  image:
    url: https://cloud.debian.org/images/cloud/bookworm/20240211-1654/debian-12-genericcloud-amd64-20240211-1654.qcow2
    sha256: 5da221d8f7434ee86145e78a2c60ca45eb4ef8296535e04f6f333193225792aa
  network: lan
  cloudInit:
    sshAuthorizedKeys:
      - "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExampleKeyReplaceMeWithYourOwnPublicKey0000 ops@example.org"
    userData: |
      #cloud-config
      packages: [nginx]
`

// handWritten40 is fleet40 without the profile: each of the 40 VM files
// written out in full, as they were before profiles.
func handWritten40(t *testing.T) string {
	t.Helper()
	files := map[string]string{}
	for _, h := range []string{"hv-a", "hv-b"} {
		data, err := os.ReadFile(filepath.Join(fleet40, "hosts", h+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		files["hosts/"+h+".yaml"] = string(data)
	}
	for i := 1; i <= 40; i++ {
		host := map[bool]string{true: "hv-b", false: "hv-a"}[i%2 == 0]
		files[fmt.Sprintf("vms/web-%02d.yaml", i)] = fmt.Sprintf("apiVersion: gitfleet.dev/v1alpha1\nkind: VM\nmetadata:\n  name: web-%02d\n  labels: {tier: web}\nspec:\n  host: %s\n%s", i, host, webProfileSpec)
	}
	return writeTree(t, files)
}

// TestProfileFleetMatchesHandWritten loads 40 VMs on one profile and the
// same 40 VMs written out in full: every effective spec, and its hash, is
// the hand-written one's.
func TestProfileFleetMatchesHandWritten(t *testing.T) {
	got, err := LoadDir(fleet40)
	if err != nil {
		t.Fatalf("LoadDir(%s): %v", fleet40, err)
	}
	want, err := LoadDir(handWritten40(t))
	if err != nil {
		t.Fatalf("LoadDir(hand-written): %v", err)
	}
	if len(got.VMs) != 40 || len(want.VMs) != 40 || len(got.Profiles) != 1 {
		t.Fatalf("%d VMs and %d profiles on the profile, %d hand-written; want 40, 1, 40", len(got.VMs), len(got.Profiles), len(want.VMs))
	}
	for name, w := range want.VMs {
		g := got.VMs[name]
		if g == nil {
			t.Errorf("VM %s missing", name)
			continue
		}
		if !reflect.DeepEqual(g.Spec, w.Spec) || SpecHash(g.Spec) != SpecHash(w.Spec) {
			t.Errorf("%s: effective spec\n%+v\nwant the hand-written\n%+v", name, g.Spec, w.Spec)
		}
		if !reflect.DeepEqual(g.Metadata, w.Metadata) || g.Profile != "web" || w.Profile != "" {
			t.Errorf("%s: metadata %+v profile %q, want %+v and web", name, g.Metadata, g.Profile, w.Metadata)
		}
	}
	// A field the VM takes from the profile is placed in the profile's file.
	if at := got.VMs["web-07"].FieldOrigin("spec.image.url"); at != (Origin{File: "profiles/web.yaml", Line: 12, Col: 10}) {
		t.Errorf("web-07 spec.image.url at %+v, want profiles/web.yaml:12:10", at)
	}
}

// profileDoc and vmDocWith write the files of the table tests below.
func profileFile(name, spec string) string {
	return "apiVersion: gitfleet.dev/v1alpha1\nkind: Profile\nmetadata:\n  name: " + name + "\nspec:\n" + spec
}

func vmFile(name, spec string) string {
	return "apiVersion: gitfleet.dev/v1alpha1\nkind: VM\nmetadata:\n  name: " + name + "\nspec:\n" + spec
}

const profileHost = `apiVersion: gitfleet.dev/v1alpha1
kind: Host
metadata: {name: hv-a}
spec:
  networks: {lan: {bridge: br0}, lab: {nat: {cidr: 10.77.0.0/24}}}
`

// baseProfile is a profile that sets a little of everything.
const baseProfile = `  vcpus: 2
  memoryMB: 2048
  diskGB: 20
  kernel:
    url: https://example.org/vmlinuz
    sha256: ` + sumA + `
    cmdline: console=ttyS0
  network: lan
  power: stopped
  cloudInit:
    sshAuthorizedKeys: ["ssh-ed25519 AAAA ops@a", "ssh-ed25519 BBBB ops@b"]
    userData: "#cloud-config\n"
`

// TestProfileOverrides pins the merge rules: mappings merge by key, a
// list or a value the VM writes replaces the profile's, an empty value
// removes it, and the VM's metadata is its own.
func TestProfileOverrides(t *testing.T) {
	for _, tc := range []struct {
		name, vm string
		// want is the VM's effective spec, written out in full.
		want string
	}{{
		name: "everything from the profile",
		vm:   "  profile: p\n  host: hv-a\n",
		want: "  host: hv-a\n" + baseProfile,
	}, {
		name: "a value the VM writes wins",
		vm:   "  profile: p\n  host: hv-a\n  memoryMB: 4096\n  power: running\n",
		want: "  host: hv-a\n" + strings.Replace(strings.Replace(baseProfile, "2048", "4096", 1), "stopped", "running", 1),
	}, {
		name: "mappings merge by key",
		vm:   "  profile: p\n  host: hv-a\n  kernel: {cmdline: console=ttyS1}\n  cloudInit: {userData: \"#!/bin/sh\\n\"}\n",
		want: "  host: hv-a\n" + strings.Replace(strings.Replace(baseProfile, "ttyS0", "ttyS1", 1), `"#cloud-config\n"`, `"#!/bin/sh\n"`, 1),
	}, {
		name: "a list replaces the profile's whole",
		vm:   "  profile: p\n  host: hv-a\n  cloudInit:\n    sshAuthorizedKeys: [\"ssh-ed25519 CCCC ops@c\"]\n",
		want: "  host: hv-a\n" + strings.Replace(baseProfile, `["ssh-ed25519 AAAA ops@a", "ssh-ed25519 BBBB ops@b"]`, `["ssh-ed25519 CCCC ops@c"]`, 1),
	}, {
		name: "an empty value removes the profile's",
		vm:   "  profile: p\n  host: hv-a\n  network:\n  power: null\n  cloudInit: {userData: null}\n  image: {url: https://example.org/d.img, sha256: " + sumB + "}\n  kernel:\n",
		want: "  host: hv-a\n  vcpus: 2\n  memoryMB: 2048\n  diskGB: 20\n  image: {url: https://example.org/d.img, sha256: " + sumB + "}\n" +
			"  cloudInit:\n    sshAuthorizedKeys: [\"ssh-ed25519 AAAA ops@a\", \"ssh-ed25519 BBBB ops@b\"]\n",
	}, {
		name: "fields the profile lacks come from the VM",
		vm:   "  profile: p\n  host: hv-a\n  volumes: [d]\n  static: {addresses: [192.168.1.5/24]}\n",
		want: "  host: hv-a\n  volumes: [d]\n  static: {addresses: [192.168.1.5/24]}\n" + baseProfile,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			volume := "apiVersion: gitfleet.dev/v1alpha1\nkind: Volume\nmetadata: {name: d}\nspec: {host: hv-a, sizeGB: 1}\n"
			got, err := LoadDir(writeTree(t, map[string]string{"h.yaml": profileHost, "d.yaml": volume,
				"p.yaml": profileFile("p", baseProfile), "vm.yaml": "# the VM\n" + strings.Replace(vmFile("a", tc.vm), "name: a", "name: a\n  labels: {x: y}", 1)}))
			if err != nil {
				t.Fatalf("with the profile: %v", err)
			}
			want, err := LoadDir(writeTree(t, map[string]string{"h.yaml": profileHost, "d.yaml": volume,
				"vm.yaml": strings.Replace(vmFile("a", tc.want), "name: a", "name: a\n  labels: {x: y}", 1)}))
			if err != nil {
				t.Fatalf("written out: %v", err)
			}
			g, w := got.VMs["a"], want.VMs["a"]
			if !reflect.DeepEqual(g.Spec, w.Spec) {
				t.Errorf("effective spec\n%+v\nwant\n%+v", g.Spec, w.Spec)
			}
			if !reflect.DeepEqual(g.Metadata, w.Metadata) {
				t.Errorf("metadata %+v, want the VM's own %+v", g.Metadata, w.Metadata)
			}
		})
	}
}

// TestProfileErrors pins where errors of a fleet with profiles are
// reported: an error of the profile's own at the profile's line (once,
// however many VMs name it), an error of the effective spec at the value
// that won (in the profile's file, naming the VM), a field neither file
// writes at the VM's spec, and a profile nobody defines at each VM that
// names it.
func TestProfileErrors(t *testing.T) {
	vmA := vmFile("a", "  profile: p\n  host: hv-a\n")
	vmB := vmFile("b", "  profile: p\n  host: hv-a\n")
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  []string
	}{{
		name:  "a value out of range in the profile",
		files: map[string]string{"p.yaml": profileFile("p", strings.Replace(baseProfile, "memoryMB: 2048", "memoryMB: 20", 1)), "a.yaml": vmA, "b.yaml": vmB},
		want:  []string{"p.yaml:7:13: spec.memoryMB: 20 is out of range; must be 64 to 4194304 MiB"},
	}, {
		name:  "an unknown field in the profile",
		files: map[string]string{"p.yaml": profileFile("p", "  vcpu: 2\n"), "a.yaml": vmA},
		want:  []string{`p.yaml:6:3: spec.vcpu: unknown field "vcpu"; did you mean "vcpus"?`},
	}, {
		name:  "a profile that sets host",
		files: map[string]string{"p.yaml": profileFile("p", "  host: hv-a\n  hots: x\n")},
		want: []string{"p.yaml:6:3: spec.host: a Profile does not set host: a VM's host is where its disk lives, and a change of it destroys the VM there and creates it empty on the other host; write host in each VM's file",
			`p.yaml:7:3: spec.hots: unknown field "hots"; known fields: vcpus, memoryMB, diskGB, image, kernel, power, network, static, nics, volumes, cloudInit, backup, firmware, secureBoot, tpm, arch, machine, cpuModel, allowFirmwareChangeFrom`},
	}, {
		name:  "a profile that names a profile",
		files: map[string]string{"p.yaml": profileFile("p", "  profile: q\n")},
		want:  []string{"p.yaml:6:3: spec.profile: a Profile does not name another profile (profiles do not nest); write the fields here"},
	}, {
		name:  "encrypted user-data in a profile",
		files: map[string]string{"p.yaml": profileFile("p", "  cloudInit:\n    encryptedUserData: {recipient: age1x, ciphertext: x}\n")},
		want:  []string{"p.yaml:7:5: spec.cloudInit.encryptedUserData: a Profile does not hold encryptedUserData: encrypted user-data is sealed to one VM and its host (gitfleet encrypt VMFILE); write it in the VM's file, or plain userData here"},
	}, {
		name:  "an error of the VM's own stays the VM's",
		files: map[string]string{"p.yaml": profileFile("p", baseProfile), "a.yaml": vmFile("a", "  profile: p\n  host: hv-a\n  vcpus: 0\n")},
		want:  []string{"a.yaml:8:10: spec.vcpus: 0 is out of range; must be 1 to 256"},
	}, {
		name:  "a field neither writes",
		files: map[string]string{"p.yaml": profileFile("p", "  vcpus: 1\n  image: {url: https://example.org/a.img}\n"), "a.yaml": vmA},
		want: []string{`a.yaml:5:1: spec.diskGB: missing: neither the VM nor its profile "p" sets it`,
			`a.yaml:5:1: spec.memoryMB: missing: neither the VM nor its profile "p" sets it`,
			`p.yaml:7:3: spec.image.sha256: missing: neither the VM nor its profile "p" sets it (for VM "a", which takes it from profile "p" at a.yaml:6:12)`},
	}, {
		name:  "an empty value that removes a required field",
		files: map[string]string{"p.yaml": profileFile("p", baseProfile), "a.yaml": vmFile("a", "  profile: p\n  host: hv-a\n  vcpus:\n")},
		want:  []string{"a.yaml:8:3: spec.vcpus: missing (the value is empty)"},
	}, {
		name: "a profile's field that does not fit the VM",
		files: map[string]string{"p.yaml": profileFile("p", baseProfile+"  static: {addresses: [10.9.0.5/24]}\n"),
			"a.yaml": vmFile("a", "  profile: p\n  host: hv-a\n  network: lab\n"), "b.yaml": vmFile("b", "  profile: p\n  host: hv-a\n  network:\n")},
		want: []string{`p.yaml:18:3: spec.static: needs spec.network: a static address is for a NIC on a host network (for VM "b", which takes it from profile "p" at b.yaml:6:12)`,
			`p.yaml:18:24: spec.static.addresses[0]: 10.9.0.5 is outside 10.77.0.0/24, the CIDR of network "lab" (for VM "a", which takes it from profile "p" at a.yaml:6:12)`},
	}, {
		name:  "a profile's network the VM's host lacks",
		files: map[string]string{"p.yaml": profileFile("p", strings.Replace(baseProfile, "network: lan", "network: wan", 1)), "a.yaml": vmA, "b.yaml": vmB},
		want: []string{`p.yaml:13:12: spec.network: Host "hv-a" has no network "wan" (for VM "a", which takes it from profile "p" at a.yaml:6:12)`,
			`p.yaml:13:12: spec.network: Host "hv-a" has no network "wan" (for VM "b", which takes it from profile "p" at b.yaml:6:12)`},
	}, {
		name:  "a profile nobody defines",
		files: map[string]string{"a.yaml": vmA, "b.yaml": vmB, "c.yaml": vmFile("c", "  profile: q\n  host: hv-a\n"), "q.yaml": profileFile("q", baseProfile)},
		want: []string{`a.yaml:6:12: spec.profile: Profile "p" does not exist; a profile is deleted or renamed only once no VM names it, and it is named by 2 VMs: a (a.yaml:6:12), b (b.yaml:6:12)`,
			`b.yaml:6:12: spec.profile: Profile "p" does not exist; a profile is deleted or renamed only once no VM names it, and it is named by 2 VMs: a (a.yaml:6:12), b (b.yaml:6:12)`},
	}, {
		name:  "a profile defined twice",
		files: map[string]string{"p.yaml": profileFile("p", baseProfile), "q.yaml": profileFile("p", baseProfile), "a.yaml": vmA},
		want:  []string{`q.yaml:4:9: metadata.name: Profile "p" is also defined in p.yaml:4:9; names are unique per kind`},
	}, {
		name:  "a VM's profile that is not a name",
		files: map[string]string{"a.yaml": vmFile("a", "  profile: Web\n  host: hv-a\n")},
		want:  []string{`a.yaml:6:12: spec.profile: "Web" is not a DNS label (RFC 1123): lowercase letters, digits and '-', starting and ending with a letter or digit`},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			files := withFiles(map[string]string{"h.yaml": profileHost}, tc.files)
			_, err := LoadDir(writeTree(t, files))
			var list ErrorList
			if !errors.As(err, &list) {
				t.Fatalf("err = %v, want an ErrorList", err)
			}
			if got := errStrings(list); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("errors:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(tc.want, "\n     "))
			}
		})
	}
}

// TestProfileDeleteRefused deletes the profile of 40 VMs: every one of
// them is an error at its spec.profile, naming the VMs. An unused
// profile goes without a word.
func TestProfileDeleteRefused(t *testing.T) {
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(fleet40)); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "profiles", "web.yaml"), filepath.Join(dir, "profiles", "old.yaml")); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(dir, "profiles", "old.yaml")
	data, err := os.ReadFile(old)
	if err != nil {
		t.Fatal(err)
	}
	// Renamed: no VM follows.
	if err := os.WriteFile(old, []byte(strings.Replace(string(data), "name: web", "name: old", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = LoadDir(dir)
	var list ErrorList
	if !errors.As(err, &list) || len(list) != 40 {
		t.Fatalf("err = %v; want 40 errors", err)
	}
	for i, e := range list {
		file := fmt.Sprintf("vms/web-%02d.yaml", i+1)
		if e.File != file || e.Line != 7 || e.Col != 12 || e.Field != "spec.profile" ||
			!strings.Contains(e.Msg, `Profile "web" does not exist`) || !strings.Contains(e.Msg, "named by 40 VMs: web-01 (vms/web-01.yaml:7:12), web-02 (vms/web-02.yaml:7:12)") ||
			!strings.HasSuffix(e.Msg, "web-10 (vms/web-10.yaml:7:12), and 30 more") {
			t.Errorf("error %d = %v", i, e)
		}
	}
	// Deleting the renamed, unused profile is fine.
	if err := os.Remove(old); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "profiles", "web.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "profiles", "unused.yaml"), []byte(profileFile("unused", "  vcpus: 1\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadDir(dir); err != nil {
		t.Fatalf("with an unused profile: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, "profiles", "unused.yaml")); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadDir(dir); err != nil {
		t.Fatalf("an unused profile deleted: %v", err)
	}
}

// TestProfileReload reloads a tree whose profile changed: every VM that
// names it is decoded again, and one VM's change reuses the others.
func TestProfileReload(t *testing.T) {
	files := map[string]string{"h.yaml": profileHost, "p.yaml": profileFile("p", baseProfile)}
	for i := 0; i < 5; i++ {
		files[fmt.Sprintf("vm-%d.yaml", i)] = vmFile(fmt.Sprintf("vm-%d", i), "  profile: p\n  host: hv-a\n")
	}
	reads := 0
	l := NewLoader("")
	first, err := l.Load(newMemTree(files, &reads))
	if err != nil {
		t.Fatal(err)
	}
	files["p.yaml"] = profileFile("p", strings.Replace(baseProfile, "2048", "4096", 1))
	reads = 0
	second, err := l.Load(newMemTree(files, &reads))
	if err != nil {
		t.Fatal(err)
	}
	if reads != 1 {
		t.Errorf("a changed profile read %d files, want 1", reads)
	}
	for name, vm := range second.VMs {
		if vm.Spec.MemoryMB != 4096 || first.VMs[name].Spec.MemoryMB != 2048 {
			t.Errorf("%s: memoryMB %d after %d, want 4096 after 2048", name, vm.Spec.MemoryMB, first.VMs[name].Spec.MemoryMB)
		}
	}
	files["vm-3.yaml"] = vmFile("vm-3", "  profile: p\n  host: hv-a\n  vcpus: 4\n")
	third, err := l.Load(newMemTree(files, &reads))
	if err != nil {
		t.Fatal(err)
	}
	for name, vm := range third.VMs {
		if changed := name == "vm-3"; (vm != second.VMs[name]) != changed {
			t.Errorf("%s: decoded again = %v, want %v", name, vm != second.VMs[name], changed)
		}
	}
	if third.VMs["vm-3"].Spec.VCPUs != 4 {
		t.Errorf("vm-3 vcpus = %d, want 4", third.VMs["vm-3"].Spec.VCPUs)
	}
}

// TestProfileUserDataUnderEncrypted gives a VM encrypted user-data over a
// profile's plain userData: both is an error that says how to drop the
// profile's, and userData: null does.
func TestProfileUserDataUnderEncrypted(t *testing.T) {
	r := newRecipient(t)
	files := sealedFleet(t, r, r, seal(t, r, secretUserData))
	vm := strings.Replace(files["vms/web-01.yaml"], "  vcpus: 1\n", "  profile: p\n  vcpus: 1\n", 1)
	files["p.yaml"] = profileFile("p", "  cloudInit: {userData: \"#cloud-config\\n\"}\n")
	files["vms/web-01.yaml"] = vm
	_, err := LoadDir(writeTree(t, files))
	want := `vms/web-01.yaml:12:5: spec.cloudInit.encryptedUserData: spec.cloudInit has both userData and encryptedUserData; a VM's user-data is one or the other (gitfleet encrypt replaces userData with encryptedUserData); to leave out the userData of profile "p", write userData: null beside encryptedUserData`
	if err == nil || err.Error() != want {
		t.Fatalf("err =\n%v\nwant\n%s", err, want)
	}
	files["vms/web-01.yaml"] = strings.Replace(vm, "    encryptedUserData:\n", "    userData: null\n    encryptedUserData:\n", 1)
	f, err := LoadDir(writeTree(t, files))
	if err != nil {
		t.Fatal(err)
	}
	if ci := f.VMs["web-01"].Spec.CloudInit; ci.UserData != "" || ci.EncryptedUserData == nil || ci.EncryptedUserData.Recipient != r {
		t.Errorf("cloudInit = %+v, want the VM's encrypted user-data alone", ci)
	}
}

// fleet40With loads fleet40 with the given files replaced (content "" removes one).
func fleet40With(t *testing.T, files map[string]string) *Fleet {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(fleet40)); err != nil {
		t.Fatal(err)
	}
	for p, content := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if content == "" {
			if err := os.Remove(full); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := LoadDir(dir)
	if err != nil {
		t.Fatalf("LoadDir: %v", err)
	}
	return f
}

// webProfileWith is the fleet's profile file with old replaced by new.
func webProfileWith(t *testing.T, old, new string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(fleet40, "profiles", "web.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), old) {
		t.Fatalf("the profile has no %q", old)
	}
	return strings.Replace(string(data), old, new, 1)
}

func web(i int) string { return fmt.Sprintf("web-%02d", i) }

// webRange names web-from to web-to.
func webRange(from, to int) []string {
	var names []string
	for i := from; i <= to; i++ {
		names = append(names, web(i))
	}
	return names
}

// TestPlanOfProfileChange plans changes of the profile of 40 VMs: each
// VM's update is the effective field with its own effect, and the
// profile's entry groups the VMs it reaches by effect.
func TestPlanOfProfileChange(t *testing.T) {
	base := fleet40With(t, nil)
	const newImage = "    url: https://cloud.debian.org/images/cloud/bookworm/20250210-2019/debian-12-genericcloud-amd64-20250210-2019.qcow2\n    sha256: 6b0ea1ec01a3a7cd7bb0a3d4e3c0e48b3c2c0c3e1d0f5a6b7c8d9e0f1a2b3c4d\n"
	const oldImage = "    url: https://cloud.debian.org/images/cloud/bookworm/20240211-1654/debian-12-genericcloud-amd64-20240211-1654.qcow2\n    sha256: 5da221d8f7434ee86145e78a2c60ca45eb4ef8296535e04f6f333193225792aa\n"
	vm := func(i int, extra string) string {
		host := map[bool]string{true: "hv-b", false: "hv-a"}[i%2 == 0]
		return vmFile(web(i), "  profile: web\n  host: "+host+"\n"+extra)
	}
	for _, tc := range []struct {
		name  string
		base  map[string]string
		head  map[string]string
		want  []ProfileReach
		field string // a field every reached VM's update carries
	}{{
		name:  "memory: 40 restarts",
		head:  map[string]string{"profiles/web.yaml": webProfileWith(t, "memoryMB: 2048", "memoryMB: 4096")},
		want:  []ProfileReach{{EffectRestart, webRange(1, 40)}},
		field: "spec.memoryMB",
	}, {
		name:  "image: not applied to 40",
		head:  map[string]string{"profiles/web.yaml": webProfileWith(t, oldImage, newImage)},
		want:  []ProfileReach{{EffectNotApplied, webRange(1, 40)}},
		field: "spec.image.url",
	}, {
		name: "memory and image, some VMs writing their own, one stopped, one new, one moved",
		base: map[string]string{"vms/web-03.yaml": vm(3, "  power: stopped\n"), "vms/web-04.yaml": vm(4, "  memoryMB: 8192\n"),
			"vms/web-05.yaml": vm(5, "  memoryMB: 8192\n  image:\n"+oldImage)},
		head: map[string]string{"profiles/web.yaml": webProfileWith(t, "memoryMB: 2048\n  diskGB: 20\n  image:\n"+oldImage, "memoryMB: 4096\n  diskGB: 20\n  image:\n"+newImage),
			"vms/web-03.yaml": vm(3, "  power: stopped\n"), "vms/web-04.yaml": vm(4, "  memoryMB: 8192\n"),
			"vms/web-05.yaml": vm(5, "  memoryMB: 8192\n  image:\n"+oldImage), "vms/web-41.yaml": vm(41, ""),
			"vms/web-06.yaml": strings.Replace(vm(6, ""), "hv-b", "hv-a", 1)},
		want: []ProfileReach{
			{EffectRestart, append(webRange(1, 2), webRange(7, 40)...)},
			{EffectNextBoot, []string{"web-03"}},
			{EffectNotApplied, append(webRange(1, 4), webRange(7, 40)...)},
			{EffectCreated, []string{"web-06", "web-41"}},
			{EffectUnchanged, []string{"web-05"}},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			b := base
			if tc.base != nil {
				b = fleet40With(t, tc.base)
			}
			p := ComputePlan(b, fleet40With(t, tc.head), PlanOptions{})
			if len(p.Profiles) != 1 || p.Profiles[0].Name != "web" || p.Profiles[0].Action != ActionUpdate || p.Profiles[0].File != "profiles/web.yaml" {
				t.Fatalf("profiles = %+v, want the update of web", p.Profiles)
			}
			if got := p.Profiles[0].Reaches; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("reaches:\n got %+v\nwant %+v", got, tc.want)
			}
			if tc.field == "" {
				return
			}
			updates := 0
			for _, h := range p.Hosts {
				for _, c := range h.Changes {
					if c.Action != ActionUpdate || len(c.Fields) == 0 || !strings.HasPrefix(c.Fields[0].Field, strings.TrimSuffix(tc.field, ".url")) {
						t.Errorf("%s: %+v, want an update of %s", h.Host, c, tc.field)
					}
					updates++
				}
			}
			if updates != 40 {
				t.Errorf("%d VM updates, want 40", updates)
			}
		})
	}
}

// TestPlanOfProfileGolden pins the text and the pull-request comment of
// the plan of a memory change of the profile of 40 VMs.
func TestPlanOfProfileGolden(t *testing.T) {
	p := ComputePlan(fleet40With(t, nil), fleet40With(t, map[string]string{
		"profiles/web.yaml": webProfileWith(t, "memoryMB: 2048", "memoryMB: 4096")}), PlanOptions{})
	p.Base, p.Head = "1111111111111111111111111111111111111111", "2222222222222222222222222222222222222222"
	planGolden(t, "profile.txt", p.Text())
	planGolden(t, "profile.md", p.Markdown())
}

// TestPlanOfProfileCreateAndDelete plans a new profile that VMs switch
// to, and the old one deleted in the same change.
func TestPlanOfProfileCreateAndDelete(t *testing.T) {
	profile, err := os.ReadFile(filepath.Join(fleet40, "profiles", "web.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	head := map[string]string{"profiles/web.yaml": "", "profiles/web2.yaml": strings.Replace(strings.Replace(string(profile), "name: web", "name: web2", 1), "vcpus: 2", "vcpus: 3", 1)}
	for i := 1; i <= 40; i++ {
		host := map[bool]string{true: "hv-b", false: "hv-a"}[i%2 == 0]
		head[fmt.Sprintf("vms/web-%02d.yaml", i)] = strings.Replace(vmFile(web(i), "  profile: web2\n  host: "+host+"\n"), "\nspec:", "\n  labels: {tier: web}\nspec:", 1)
	}
	p := ComputePlan(fleet40With(t, nil), fleet40With(t, head), PlanOptions{})
	if len(p.Profiles) != 2 {
		t.Fatalf("profiles = %+v", p.Profiles)
	}
	if c := p.Profiles[0]; c.Name != "web" || c.Action != ActionDelete || c.File != "profiles/web.yaml" || c.Reaches != nil {
		t.Errorf("first = %+v, want the delete of web, reaching nothing", c)
	}
	if c := p.Profiles[1]; c.Name != "web2" || c.Action != ActionCreate || !reflect.DeepEqual(c.Reaches, []ProfileReach{{EffectRestart, webRange(1, 40)}}) {
		t.Errorf("second = %+v, want web2 created, restarting 40", c)
	}
	for _, h := range p.Hosts {
		for _, c := range h.Changes {
			want := []FieldChange{{Field: "spec.profile", Old: "web", New: "web2", Effect: EffectNone},
				{Field: "spec.vcpus", Old: "2", New: "3", Effect: EffectRestart}}
			if !reflect.DeepEqual(c.Fields, want) {
				t.Errorf("%s: fields %+v, want %+v", c.Name, c.Fields, want)
			}
		}
	}
}

// TestExplainVM pins gitfleet show's view of a VM on a profile: every
// field of the effective spec with the FILE:LINE:COL its value came from.
func TestExplainVM(t *testing.T) {
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(fleet40)); err != nil {
		t.Fatal(err)
	}
	web07 := filepath.Join(dir, "vms", "web-07.yaml")
	data, err := os.ReadFile(web07)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(web07, append(data, "  memoryMB: 4096\n  kernel: {url: \"https://u:p@example.org/k\", sha256: "+sumA+"}\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	ex, err := ExplainVM(DirTree(dir), "", "web-07")
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "explain/web-07.txt", []byte(ex.Text()))
	js, err := ex.JSON()
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "explain/web-07.json", js)
	if strings.Contains(ex.Text(), "nginx") || strings.Contains(ex.Text(), "u:p@") {
		t.Errorf("a secret or a URL's credentials shown:\n%s", ex.Text())
	}
	if ex, err := ExplainVM(DirTree(dir), "", "web-99"); !errors.Is(err, ErrNoSuchVM) {
		t.Errorf("web-99: %v, %v; want ErrNoSuchVM", ex, err)
	}
	if err := os.WriteFile(web07, append(data, "  vcpus: 0\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ExplainVM(DirTree(dir), "", "web-07"); !errors.Is(err, ErrInvalid) {
		t.Errorf("an invalid fleet explained: %v", err)
	}
}

// TestPlanOfProfileLabels: a profile's own labels reach no VM.
func TestPlanOfProfileLabels(t *testing.T) {
	p := ComputePlan(fleet40With(t, nil), fleet40With(t, map[string]string{
		"profiles/web.yaml": webProfileWith(t, "name: web\n", "name: web\n  labels: {owner: ops}\n")}), PlanOptions{})
	if len(p.Hosts) != 0 || len(p.Profiles) != 1 || p.Profiles[0].Reaches != nil || !strings.Contains(p.Text(), "metadata.labels.owner: (none) -> ops\n  reaches no VM\n") {
		t.Fatalf("plan:\n%s", p.Text())
	}
}
