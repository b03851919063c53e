package desired

import (
	"fmt"
	"strings"
	"testing"
)

// vmHead is lines 1-5 of a VM file; spec fields start on line 6.
const vmHead = "apiVersion: gitfleet.dev/v1alpha1\nkind: VM\nmetadata:\n  name: web-01\nspec:\n"

// vmBody is a valid spec for vmHead, lines 6-12.
const vmBody = "  host: hv-a\n  vcpus: 2\n  memoryMB: 2048\n  diskGB: 20\n  image:\n    url: https://example.org/d.qcow2\n    sha256: " + sumA + "\n"

// vm returns vmHead followed by spec lines (each indented by the caller).
func vm(spec string) string { return vmHead + spec }

func errStrings(errs []*Error) []string {
	out := make([]string, len(errs))
	for i, e := range errs {
		out[i] = e.Error()
	}
	return out
}

// bomb is a billion-laughs document: expanded, it would be 9^6 nodes.
const bomb = "b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n" +
	"d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"

// TestParseAdoptedVM pins the fields of an adopted VM: a MAC written
// unquoted (as libvirt prints it) is the string, and no image or kernel
// is needed beside rootDisk.adopt.
func TestParseAdoptedVM(t *testing.T) {
	obj, errs := parseFile("obj.yaml", []byte(vm("  host: hv-a\n  vcpus: 2\n  memoryMB: 2048\n  diskGB: 20\n  mac: 52:54:00:12:34:56\n  rootDisk: {adopt: true}\n")))
	if len(errs) > 0 {
		t.Fatalf("errors: %v", errStrings(errs))
	}
	s := obj.vm.Spec
	if s.MAC != "52:54:00:12:34:56" || s.RootDisk == nil || !s.RootDisk.Adopt {
		t.Errorf("spec.mac = %q, spec.rootDisk = %+v; want the MAC and adopt: true", s.MAC, s.RootDisk)
	}
}

func TestParseFileErrors(t *testing.T) {
	sum := sumA
	big := vm(vmBody) + "#" + strings.Repeat("x", MaxFileSize) + "\n"
	tests := []struct {
		name  string
		input string
		want  []string
	}{
		// Unknown fields, duplicate keys, wrong types.
		{"unknown field with suggestion", vm(strings.Replace(vmBody, "vcpus: 2", "vcpu: 2", 1)), []string{
			`obj.yaml:5:1: spec.vcpus: missing`,
			`obj.yaml:7:3: spec.vcpu: unknown field "vcpu"; did you mean "vcpus"?`,
		}},
		{"unknown top-level field", vm(vmBody) + "status: {}\n", []string{
			`obj.yaml:13:1: status: unknown field "status"; known fields: apiVersion, kind, metadata, spec`,
		}},
		{"duplicate key", vm(vmBody + "  vcpus: 4\n"), []string{
			`obj.yaml:13:3: spec.vcpus: duplicate key "vcpus" (first written at line 7); a key may appear only once`,
		}},
		{"quoted integer", vm(strings.Replace(vmBody, "vcpus: 2", `vcpus: "2"`, 1)), []string{
			`obj.yaml:7:10: spec.vcpus: must be an integer, got the string "2"`,
		}},
		{"float in integer field", vm(strings.Replace(vmBody, "memoryMB: 2048", "memoryMB: 1e3", 1)), []string{
			`obj.yaml:8:13: spec.memoryMB: must be a plain decimal integer such as 42, got 1e3`,
		}},
		{"boolean in integer field", vm(strings.Replace(vmBody, "diskGB: 20", "diskGB: true", 1)), []string{
			`obj.yaml:9:11: spec.diskGB: must be an integer, got the boolean true`,
		}},
		{"hex integer", vm(strings.Replace(vmBody, "vcpus: 2", "vcpus: 0x2", 1)), []string{
			`obj.yaml:7:10: spec.vcpus: must be a plain decimal integer such as 42, got 0x2`,
		}},
		{"leading zero integer", vm(strings.Replace(vmBody, "memoryMB: 2048", "memoryMB: 02048", 1)), []string{
			`obj.yaml:8:13: spec.memoryMB: must be a plain decimal integer such as 42, got 02048`,
		}},
		{"integer overflow", vm(strings.Replace(vmBody, "diskGB: 20", "diskGB: 99999999999999999999", 1)), []string{
			`obj.yaml:9:11: spec.diskGB: integer 99999999999999999999 is out of range`,
		}},
		{"octal-looking string field", vm(strings.Replace(vmBody, "host: hv-a", "host: 007", 1)), []string{
			`obj.yaml:6:9: spec.host: must be a string, got the integer 007; if you mean the text, quote it: "007"`,
		}},
		{"float-looking string field", vm(vmBody + "  network: 1.10\n"), []string{
			`obj.yaml:13:12: spec.network: must be a string, got the number 1.10; if you mean the text, quote it: "1.10"`,
		}},
		{"exponent-looking label value", strings.Replace(vm(vmBody), "  name: web-01\n", "  name: web-01\n  labels: {build: 1e3}\n", 1), []string{
			`obj.yaml:5:19: metadata.labels.build: must be a string, got the number 1e3; if you mean the text, quote it: "1e3"`,
		}},
		{"boolean in string field", vm(vmBody + "  network: true\n"), []string{
			`obj.yaml:13:12: spec.network: must be a string, got the boolean true; if you mean the text, quote it: "true"`,
		}},
		{"mapping in string field", vm(strings.Replace(vmBody, "host: hv-a", "host: {name: hv-a}", 1)), []string{
			`obj.yaml:6:9: spec.host: must be a string, got a mapping`,
		}},
		{"scalar where a list belongs", vm(vmBody + "  volumes: data-01\n"), []string{
			`obj.yaml:13:12: spec.volumes: must be a list, got the string "data-01"`,
		}},
		{"null list item", vm(vmBody + "  volumes: [data-01, ~]\n"), []string{
			`obj.yaml:13:22: spec.volumes[1]: must be a string, got null (an empty value); if you mean the text, quote it: "~"`,
		}},
		{"list where a mapping belongs", vm(vmBody + "  cloudInit: [x]\n"), []string{
			`obj.yaml:13:14: spec.cloudInit: must be a mapping, got a list`,
		}},
		{"explicit tag", vm(strings.Replace(vmBody, "vcpus: 2", `vcpus: !!int "2"`, 1)), []string{
			`obj.yaml:7:10: spec.vcpus: explicit tags (!!int) are not supported; write strings in quotes instead`,
		}},
		{"non-string key", vm(vmBody + "  1: x\n"), []string{
			`obj.yaml:13:3: spec: keys must be strings, got the integer 1`,
		}},

		// Zero, two, or non-mapping documents; apiVersion and kind.
		{"empty file", "", []string{
			`obj.yaml:1:1: no object in file; each *.yaml / *.yml file holds exactly one object (remove the file or give it one)`,
		}},
		{"only comments", "# web-01 was here\n# gone\n", []string{
			`obj.yaml:1:1: no object in file; each *.yaml / *.yml file holds exactly one object (remove the file or give it one)`,
		}},
		{"only document markers", "---\n---\n...\n", []string{
			`obj.yaml:1:1: no object in file; each *.yaml / *.yml file holds exactly one object (remove the file or give it one)`,
		}},
		{"two objects", vm(vmBody) + "---\n" + vm(vmBody), []string{
			`obj.yaml:14:1: a second YAML document; each file holds exactly one object (split it into two files)`,
		}},
		{"trailing document marker is fine", vm(vmBody) + "---\n", nil},
		{"Git LFS pointer", "version https://git-lfs.github.com/spec/v1\noid sha256:" + strings.Repeat("4d", 32) + "\nsize 812\n", []string{
			"obj.yaml:1:1: a Git LFS pointer, not the file's content: Git LFS keeps the content outside the repository, and gitfleet reads only what is committed; " +
				"stop tracking YAML files with Git LFS (`git lfs untrack '*.yaml' '*.yml'`, then `git add --renormalize .` and commit)",
		}},
		{"list at the top", "- kind: VM\n", []string{
			`obj.yaml:1:1: an object must be a mapping with apiVersion, kind, metadata and spec; got a list`,
		}},
		{"unknown apiVersion", strings.Replace(vm(vmBody), "v1alpha1", "v1", 1), []string{
			`obj.yaml:1:13: apiVersion: unknown apiVersion "gitfleet.dev/v1"; this release reads gitfleet.dev/v1alpha1`,
		}},
		{"unknown kind", strings.Replace(vm(vmBody), "kind: VM", "kind: Vm", 1), []string{
			`obj.yaml:2:7: kind: unknown kind "Vm"; must be VM, Volume, Host, Profile or BackupRepository`,
		}},
		{"missing kind", strings.Replace(vm(vmBody), "kind: VM\n", "", 1), []string{
			`obj.yaml:1:1: kind: missing; write kind: VM, Volume, Host, Profile or BackupRepository`,
		}},
		{"empty apiVersion", strings.Replace(vm(vmBody), "apiVersion: gitfleet.dev/v1alpha1", "apiVersion:", 1), []string{
			`obj.yaml:1:1: apiVersion: missing (the value is empty); write apiVersion: gitfleet.dev/v1alpha1`,
		}},
		{"missing spec", "apiVersion: gitfleet.dev/v1alpha1\nkind: Volume\nmetadata: {name: data-01}\n", []string{
			`obj.yaml:1:1: spec: missing`,
		}},

		// Encodings, tabs, line ends.
		{"UTF-8 byte-order mark is stripped", "\xEF\xBB\xBF" + vm(vmBody), nil},
		{"UTF-16 is rejected", "\xFF\xFEa\x00p\x00i\x00", []string{
			`obj.yaml:1:1: file is UTF-16 encoded; save it as UTF-8`,
		}},
		{"UTF-16 without a byte-order mark is rejected", "a\x00p\x00i\x00:\x00", []string{
			`obj.yaml:1:2: file contains a NUL byte; is it UTF-16 or binary? save it as UTF-8 text`,
		}},
		{"invalid UTF-8", strings.Replace(vm(vmBody), "name: web-01", "name: web-\xff1", 1), []string{
			`obj.yaml:4:13: file is not valid UTF-8; save it as UTF-8`,
		}},
		{"tab in indentation", vm(strings.Replace(vmBody, "  vcpus", "\tvcpus", 1)), []string{
			`obj.yaml:7:1: tab character in indentation; YAML indents with spaces only`,
		}},
		{"tab after spaces in indentation", vm(strings.Replace(vmBody, "    url", "  \turl", 1)), []string{
			`obj.yaml:11:3: tab character in indentation; YAML indents with spaces only`,
		}},
		{"CRLF line ends", strings.ReplaceAll(vm(vmBody), "\n", "\r\n"), nil},
		{"syntax error in a flow mapping names its line", vm(vmBody + "  labels: {a: b c: d}\n  power: running\n"), []string{
			`obj.yaml:13:1: invalid YAML: did not find expected ',' or '}' (in the flow mapping { that starts on this line or above)`,
		}},
		// The parser names only where the broken mapping starts (spec's
		// contents, line 6), and the message says so.
		{"syntax error after a quoted value names its mapping", vm(vmBody + "  power: 'running'x\n"), []string{
			`obj.yaml:6:1: invalid YAML: did not find expected key (in the block mapping that starts on this line or above)`,
		}},
		{"syntax error on the first line", "kind: [VM\n", []string{
			`obj.yaml:1:1: invalid YAML: did not find expected ',' or ']' (in the flow sequence [ that starts on this line or above)`,
		}},
		{"syntax error", vm(vmBody + "  network: [lan\n"), []string{
			`obj.yaml:13:1: invalid YAML: did not find expected ',' or ']' (in the flow sequence [ that starts on this line or above)`,
		}},

		// Anchors, aliases, merge keys.
		{"anchor", vm(strings.Replace(vmBody, "  image:\n", "  image: &img\n", 1)), []string{
			`obj.yaml:10:10: spec.image: anchors (&img) are not supported; write the value out in full`,
		}},
		{"alias", strings.Replace(vm(vmBody), "  name: web-01\n", "  name: &n web-01\n  labels: {app: *n}\n", 1), []string{
			`obj.yaml:4:9: metadata.name: anchors (&n) are not supported; write the value out in full`,
			`obj.yaml:5:17: metadata.labels.app: aliases (*n) are not supported; write the value out in full`,
		}},
		{"merge key", vm("  <<: {host: hv-a}\n" + strings.Replace(vmBody, "  host: hv-a\n", "", 1)), []string{
			`obj.yaml:6:3: spec: merge keys (<<) are not supported; write the fields out in full`,
		}},
		// The parser never expands aliases, and the decoder rejects the
		// first anchor it meets, so a bomb costs no more than its size.
		{"alias bomb", vm(vmBody + "  volumes: &a [x, x, x, x, x, x, x, x, x]\n" + bomb), []string{
			`obj.yaml:13:12: spec.volumes: anchors (&a) are not supported; write the value out in full`,
			`obj.yaml:14:1: b: unknown field "b"; known fields: apiVersion, kind, metadata, spec`,
			`obj.yaml:15:1: c: unknown field "c"; known fields: apiVersion, kind, metadata, spec`,
			`obj.yaml:16:1: d: unknown field "d"; known fields: apiVersion, kind, metadata, spec`,
		}},
		{"alias bomb nested in a known field", strings.Replace(vm(vmBody), "  name: web-01\n", "  name: web-01\n  labels: {a: &a lol, b: &b [*a, *a, *a], c: [*b, *b, *b]}\n", 1), []string{
			`obj.yaml:5:15: metadata.labels.a: anchors (&a) are not supported; write the value out in full`,
			`obj.yaml:5:26: metadata.labels.b: anchors (&b) are not supported; write the value out in full`,
			`obj.yaml:5:46: metadata.labels.c: must be a string, got a list`,
		}},

		// Size.
		{"file over 1 MiB", big, []string{
			fmt.Sprintf(`obj.yaml:1:1: file is %d bytes; an object file may be at most 1048576 bytes (1 MiB)`, len(big)),
		}},
		{"file of exactly 1 MiB", vm(vmBody) + "#" + strings.Repeat("x", MaxFileSize-len(vm(vmBody))-2) + "\n", nil},

		// Values of single fields.
		{"name not a DNS label", strings.Replace(vm(vmBody), "name: web-01", "name: Web_01", 1), []string{
			`obj.yaml:4:9: metadata.name: "Web_01" is not a DNS label (RFC 1123): lowercase letters, digits and '-', starting and ending with a letter or digit`,
		}},
		{"name too long", strings.Replace(vm(vmBody), "name: web-01", "name: "+strings.Repeat("a", 64), 1), []string{
			`obj.yaml:4:9: metadata.name: "` + strings.Repeat("a", 63) + `"… is 64 characters; a name is at most 63`,
		}},
		{"name of 63 characters", strings.Replace(vm(vmBody), "name: web-01", "name: "+strings.Repeat("a", 63), 1), nil},
		{"yes, no, on and off are strings", strings.Replace(vm(strings.Replace(vmBody, "host: hv-a", "host: no", 1)), "name: web-01", "name: on", 1), nil},
		{"values out of range", vm("  host: hv-a\n  vcpus: 0\n  memoryMB: 63\n  diskGB: 0\n  image: {url: https://example.org/d.qcow2, sha256: " + sum + "}\n"), []string{
			`obj.yaml:7:10: spec.vcpus: 0 is out of range; must be 1 to 256`,
			`obj.yaml:8:13: spec.memoryMB: 63 is out of range; must be 64 to 4194304 MiB`,
			`obj.yaml:9:11: spec.diskGB: 0 is out of range; must be 1 to 65536 GiB`,
		}},
		{"values above the upper bounds", vm("  host: hv-a\n  vcpus: 257\n  memoryMB: 4194305\n  diskGB: 65537\n  image: {url: https://example.org/d.qcow2, sha256: " + sum + "}\n"), []string{
			`obj.yaml:7:10: spec.vcpus: 257 is out of range; must be 1 to 256`,
			`obj.yaml:8:13: spec.memoryMB: 4194305 is out of range; must be 64 to 4194304 MiB`,
			`obj.yaml:9:11: spec.diskGB: 65537 is out of range; must be 1 to 65536 GiB`,
		}},
		{"sha256 uppercase", vm(strings.Replace(vmBody, sum, strings.ToUpper(sum), 1)), []string{
			`obj.yaml:12:13: spec.image.sha256: must be 64 lowercase hex digits (the file's sha256), got 64 characters "` + strings.ToUpper(sum) + `"`,
		}},
		{"sha256 too short", vm(strings.Replace(vmBody, sum, "abc123", 1)), []string{
			`obj.yaml:12:13: spec.image.sha256: must be 64 lowercase hex digits (the file's sha256), got 6 characters "abc123"`,
		}},
		{"URL scheme", vm(strings.Replace(vmBody, "https://example.org", "ftp://example.org", 1)), []string{
			`obj.yaml:11:10: spec.image.url: scheme "ftp" is not supported; use http, https or file`,
		}},
		{"URL without scheme", vm(strings.Replace(vmBody, "https://example.org/d.qcow2", "images/d.qcow2", 1)), []string{
			`obj.yaml:11:10: spec.image.url: "images/d.qcow2" has no scheme; use http, https or file`,
		}},
		{"relative file URL", vm(strings.Replace(vmBody, "https://example.org/d.qcow2", "file://d.qcow2", 1)), []string{
			`obj.yaml:11:10: spec.image.url: "file://d.qcow2" must be file:///absolute/path`,
		}},
		{"missing sha256", vm(strings.Replace(vmBody, "    sha256: "+sum+"\n", "", 1)), []string{
			`obj.yaml:10:3: spec.image.sha256: missing`,
		}},
		{"power", vm(vmBody + "  power: off\n"), []string{
			`obj.yaml:13:10: spec.power: must be running or stopped, got "off"`,
		}},
		{"no image and no kernel", vm("  host: hv-a\n  vcpus: 2\n  memoryMB: 2048\n  diskGB: 20\n"), []string{
			`obj.yaml:5:1: spec: needs an image, a kernel, or both, or an adopted root disk (rootDisk: {adopt: true})`,
		}},
		{"mac not a MAC", vm(vmBody + "  mac: \"52:54:00:zz:00:01\"\n"), []string{
			`obj.yaml:13:8: spec.mac: "52:54:00:zz:00:01" is not a MAC address such as 52:54:00:12:34:56`,
		}},
		{"mac multicast", vm(vmBody + "  mac: \"01:00:5e:00:00:01\"\n"), []string{
			`obj.yaml:13:8: spec.mac: 01:00:5e:00:00:01 is a multicast address; a NIC's MAC is unicast (the first octet even)`,
		}},
		{"mac beside nics", vm(vmBody + "  mac: \"52:54:00:12:34:56\"\n  nics: [{network: lan}]\n"), []string{
			`obj.yaml:13:3: spec.mac: is the one-NIC form's MAC; with spec.nics write each NIC's mac there`,
		}},
		{"adopted with an image", vm(vmBody + "  rootDisk: {adopt: true}\n"), []string{
			`obj.yaml:10:3: spec.image: an adopted root disk is not made from an image; remove image (or rootDisk to create the VM afresh)`,
		}},
		{"adopted with cloudInit", vm("  host: hv-a\n  vcpus: 2\n  memoryMB: 2048\n  diskGB: 20\n  rootDisk: {adopt: true}\n  cloudInit: {userData: \"#cloud-config\\n\"}\n"), []string{
			`obj.yaml:11:3: spec.cloudInit: an adopted VM gets no NoCloud seed (its guest ran cloud-init before); remove cloudInit and change the guest from inside`,
		}},
		{"rootDisk without adopt", vm("  host: hv-a\n  vcpus: 2\n  memoryMB: 2048\n  diskGB: 20\n  rootDisk: {}\n"), []string{
			`obj.yaml:5:1: spec: needs an image, a kernel, or both, or an adopted root disk (rootDisk: {adopt: true})`,
			`obj.yaml:10:3: spec.rootDisk.adopt: missing`,
		}},
		{"volume listed twice", vm(vmBody + "  volumes: [data-01, data-01]\n"), []string{
			`obj.yaml:13:22: spec.volumes[1]: volume "data-01" is listed twice (first at spec.volumes[0])`,
		}},
		{"label key", strings.Replace(vm(vmBody), "  name: web-01\n", "  name: web-01\n  labels: {\"-team\": web}\n", 1), []string{
			`obj.yaml:5:12: metadata.labels.-team: label key "-team" must be 1 to 63 letters, digits, '-', '_', '.' or '/', starting and ending with a letter or digit`,
		}},
		{"kernel and initrd", vm(strings.Replace(vmBody, "  image:\n    url: https://example.org/d.qcow2\n    sha256: "+sum+"\n",
			"  kernel:\n    sha256: "+sum+"\n    initrd: {url: https://example.org/initrd, sha256: "+sum[:63]+"}\n    cmdline: console=ttyS0\n", 1)), []string{
			`obj.yaml:10:3: spec.kernel.url: missing`,
			`obj.yaml:12:55: spec.kernel.initrd.sha256: must be 64 lowercase hex digits (the file's sha256), got 63 characters "` + sum[:63] + `"`,
		}},
		{"names of referenced objects", vm(strings.Replace(vmBody, "host: hv-a", "host: hv.a", 1) + "  network: LAN\n  volumes: [data_01]\n"), []string{
			`obj.yaml:6:9: spec.host: "hv.a" is not a DNS label (RFC 1123): lowercase letters, digits and '-', starting and ending with a letter or digit`,
			`obj.yaml:13:12: spec.network: "LAN" is not a DNS label (RFC 1123): lowercase letters, digits and '-', starting and ending with a letter or digit`,
			`obj.yaml:14:13: spec.volumes[0]: "data_01" is not a DNS label (RFC 1123): lowercase letters, digits and '-', starting and ending with a letter or digit`,
		}},
		{"ssh key with a line break", vm(vmBody + "  cloudInit: {sshAuthorizedKeys: [\"ssh-ed25519 AAAA a\\nssh-rsa BBBB b\", \"ssh-ed25519 CCCC c\\r\"]}\n"), []string{
			`obj.yaml:13:35: spec.cloudInit.sshAuthorizedKeys[0]: holds a line break: each entry is one line of authorized_keys; list each key as its own entry`,
			`obj.yaml:13:73: spec.cloudInit.sshAuthorizedKeys[1]: holds a line break: each entry is one line of authorized_keys; list each key as its own entry`,
		}},
		{"empty ssh key", vm(vmBody + "  cloudInit: {sshAuthorizedKeys: [\" \"], userData: \"#cloud-config\\n\"}\n"), []string{
			`obj.yaml:13:35: spec.cloudInit.sshAuthorizedKeys[0]: must not be empty`,
		}},
		{"empty spec", "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec:\n", []string{
			`obj.yaml:4:1: spec: missing (the value is empty)`,
		}},
		{"empty value is an absent field", vm(vmBody + "  network:\n  cloudInit: ~\n"), nil},
		{"empty required value", vm(strings.Replace(vmBody, "vcpus: 2", "vcpus:", 1)), []string{
			`obj.yaml:7:3: spec.vcpus: missing (the value is empty)`,
		}},
		{"volume size", "apiVersion: gitfleet.dev/v1alpha1\nkind: Volume\nmetadata: {name: data-01}\nspec: {host: hv-a, sizeGB: 0}\n", []string{
			`obj.yaml:4:28: spec.sizeGB: 0 is out of range; must be 1 to 65536 GiB`,
		}},
		{"host capacity and networks", "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec:\n  capacity: {vcpus: -1, memoryMB: 1024}\n  networks:\n    LAN: {bridge: br0}\n    wan: {bridge: a-very-long-bridge-name}\n    dmz: {}\n", []string{
			`obj.yaml:5:21: spec.capacity.vcpus: -1 is out of range; must be 0 to 4096 (0 means not limited)`,
			`obj.yaml:7:5: spec.networks.LAN: network name "LAN" is not a DNS label (RFC 1123): lowercase letters, digits and '-', starting and ending with a letter or digit`,
			`obj.yaml:8:19: spec.networks.wan.bridge: "a-very-long-bridge-name" is not a Linux interface name (1 to 15 letters, digits, '-', '_' or '.')`,
			`obj.yaml:9:5: spec.networks.dmz: needs bridge (an existing host bridge) or nat (a network the agent manages)`,
		}},
		{"host suspended", "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec: {suspend: true, suspendReason: \"kernel upgrade\"}\n", nil},
		{"suspend reason without suspend", "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec: {suspend: false, suspendReason: \"maintenance\"}\n", []string{
			`obj.yaml:4:24: spec.suspendReason: needs suspend: true (a reason for a host that is not suspended would say nothing true)`,
		}},
		{"suspend reason of two lines", "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec: {suspend: true, suspendReason: \"a\\nb\"}\n", []string{
			`obj.yaml:4:38: spec.suspendReason: holds a control character or invalid UTF-8; one line of text`,
		}},
		{"suspend not a boolean", "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec: {suspend: yes}\n", []string{
			`obj.yaml:4:17: spec.suspend: must be true or false, got the string "yes"`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj, errs := parseFile("obj.yaml", []byte(tt.input))
			got := errStrings(errs)
			ErrorList(errs).Sort()
			got = errStrings(errs)
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("errors:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(tt.want, "\n     "))
			}
			if (obj == nil) != (len(tt.want) > 0) {
				t.Errorf("object = %v with %d errors; want an object exactly when there are no errors", obj, len(errs))
			}
		})
	}
}

// TestYAML11WordsStayText pins that yes, no, on, off, y and n, which
// YAML 1.1 reads as booleans, reach a string field as the very text written.
func TestYAML11WordsStayText(t *testing.T) {
	input := strings.Replace(vm(strings.Replace(vmBody, "host: hv-a", "host: no", 1)), "  name: web-01\n",
		"  name: on\n  labels: {a: yes, b: off, c: y, d: n}\n", 1)
	obj, errs := parseFile("obj.yaml", []byte(input))
	if len(errs) > 0 || obj == nil {
		t.Fatalf("errors: %s", strings.Join(errStrings(errs), "; "))
	}
	want := map[string]string{"a": "yes", "b": "off", "c": "y", "d": "n"}
	if obj.vm.Metadata.Name != "on" || obj.vm.Spec.Host != "no" || fmt.Sprint(obj.vm.Metadata.Labels) != fmt.Sprint(want) {
		t.Errorf("name %q, host %q, labels %v; want on, no and %v", obj.vm.Metadata.Name, obj.vm.Spec.Host, obj.vm.Metadata.Labels, want)
	}
}

// TestParseFileTabs pins where a tab is YAML and where it is rejected: a
// line of only spaces and tabs, a tab after content, in a flow, in a
// comment or in a block scalar's content is valid and keeps its meaning;
// a tab used as indentation before a key, a value or a list item, or where
// a block scalar's lines are indented, is rejected with a message that
// says so, on the line of the tab.
func TestParseFileTabs(t *testing.T) {
	const blockTab = "tab character in the indentation of a block scalar (| or >); YAML indents with spaces only, and a blank line inside the block may hold only spaces"
	const tabIndent = "tab character in indentation; YAML indents with spaces only"
	// spec lines 6-12 are vmBody's; userData starts at line 13.
	withVcpus := func(before string) string { return vm(strings.Replace(vmBody, "  vcpus", before+"  vcpus", 1)) }
	script := "  cloudInit:\n    userData: |\n      #!/bin/sh\n      runcmd:\n      -\techo\n      \t\n      \tindented\n"
	const scriptData = "#!/bin/sh\nruncmd:\n-\techo\n\t\n\tindented\n"
	tests := []struct {
		name     string
		input    string
		want     []string // errors; none: the object is accepted
		userData string   // with no errors, the userData the VM must have
		keys     int      // with no errors, the number of ssh keys
	}{
		{"line of one tab between keys", withVcpus("\t\n"), nil, "", 0},
		{"line of spaces and tabs", withVcpus(" \t \t\n"), nil, "", 0},
		{"tab lines in a nested mapping", vm(strings.Replace(vmBody, "    sha256", "\t\n  \t\n    \t  \n    sha256", 1)), nil, "", 0},
		{"tab line first in the file", "\t\n" + vm(vmBody), nil, "", 0},
		{"tab line last, without a line end", vm(vmBody) + "\t", nil, "", 0},
		{"tab lines and CRLF line ends", strings.ReplaceAll(withVcpus("\t\n \t\n"), "\n", "\r\n"), nil, "", 0},
		{"tab after a value", vm(strings.Replace(vmBody, "vcpus: 2", "vcpus: 2\t", 1)), nil, "", 0},
		{"tab before a comment after a value", vm(strings.Replace(vmBody, "vcpus: 2", "vcpus: 2\t# two", 1)), nil, "", 0},
		{"tab inside a comment", withVcpus("  #\tsizes\t\n"), nil, "", 0},
		{"comment line indented by a tab", withVcpus("\t# sizes\n"), nil, "", 0},
		{"comment line indented by spaces and a tab", withVcpus("  \t# sizes\n"), nil, "", 0},
		{"tab inside a flow", vm(strings.Replace(vmBody, "  image:\n    url: https://example.org/d.qcow2\n    sha256: ",
			"  image: {url: https://example.org/d.qcow2,\tsha256: ", 1) + "}\n"), nil, "", 0},
		{"tab-indented line and tab line inside a flow", vm(vmBody + "  cloudInit:\n    sshAuthorizedKeys: [\"ssh-ed25519 AAAA a\",\n\t\n\t\"ssh-ed25519 BBBB b\"]\n"), nil, "", 2},
		{"tab line inside a quoted value", vm(vmBody + "  cloudInit:\n    userData: \"#!a\n\t\n      b\"\n"), nil, "#!a\nb", 0},
		{"tabs in a block scalar's content", vm(vmBody + script), nil, scriptData, 0},
		{"tabs in a block scalar's content and a tab line outside it", vm(strings.Replace(vmBody, "  vcpus", "\t\n  vcpus", 1) + script + "\t\n  power: running\n"), nil, scriptData, 0},
		{"tab line and tab comment after a block scalar", vm(vmBody + "  cloudInit:\n    userData: |\n      #!a\n\t\n \t# end\n  power: running\n"), nil, "#!a\n", 0},
		{"tab line after a block scalar at the end of the file", vm(vmBody + "  cloudInit:\n    userData: >-\n      #!a\n      b\n\t\n"), nil, "#!a b", 0},

		{"tab indenting a key", withVcpus("") + "\tpower: running\n", []string{`obj.yaml:13:1: ` + tabIndent}, "", 0},
		{"tab after spaces indenting a key", vm(strings.Replace(vmBody, "  vcpus", "  \tvcpus", 1)), []string{`obj.yaml:7:3: ` + tabIndent}, "", 0},
		{"tab indenting a nested key after tab lines", vm(strings.Replace(vmBody, "    url", "\t\n  \t\n\t  url", 1)), []string{`obj.yaml:13:1: ` + tabIndent}, "", 0},
		{"tab indenting a list item", vm(vmBody + "  volumes:\n\t- data\n"), []string{`obj.yaml:14:1: ` + tabIndent}, "", 0},
		{"tab line in a block scalar, left of its indentation", vm(vmBody + "  cloudInit:\n    userData: |\n      a\n\t\n      b\n"), []string{`obj.yaml:16:1: ` + blockTab}, "", 0},
		{"tab line in a block scalar and one outside it", withVcpus("\t\n") + "  cloudInit:\n    userData: |\n      a\n  \t\n      b\n", []string{`obj.yaml:17:3: ` + blockTab}, "", 0},
		{"tab line in a folded block scalar", vm(vmBody + "  cloudInit:\n    userData: >\n      a\n \t\n      b\n"), []string{`obj.yaml:16:2: ` + blockTab}, "", 0},
		{"tab line first in a block scalar", vm(vmBody + "  cloudInit:\n    userData: |\n\t\n      a\n"), []string{`obj.yaml:15:1: ` + blockTab}, "", 0},
		// YAML ends a block scalar kept with + at the tab line; the parser
		// cannot tell, and clearing the line would add a line end to it.
		{"tab line after a block scalar with keep chomping", vm(vmBody + "  cloudInit:\n    userData: |+\n      a\n\t\n  power: running\n"), []string{`obj.yaml:16:1: ` + blockTab}, "", 0},
		{"tab indenting a block scalar's line", vm(vmBody + "  cloudInit:\n    userData: |\n      a\n\tb\n"), []string{`obj.yaml:16:1: ` + blockTab}, "", 0},
		{"a syntax error is not blamed on tabs", withVcpus("\t\n") + script + "  network: [lan\n", []string{`obj.yaml:21:1: invalid YAML: did not find expected ',' or ']' (in the flow sequence [ that starts on this line or above)`}, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj, errs := parseFile("obj.yaml", []byte(tt.input))
			ErrorList(errs).Sort()
			if got := errStrings(errs); strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Fatalf("errors:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(tt.want, "\n     "))
			}
			if tt.want != nil {
				return
			}
			if obj == nil || obj.vm == nil {
				t.Fatalf("object = %v; want a VM", obj)
			}
			spec := obj.vm.Spec
			if spec.VCPUs != 2 || spec.Image == nil || spec.Image.SHA256 != sumA {
				t.Errorf("spec = %+v; want vmBody's", spec)
			}
			var userData string
			var keys int
			if spec.CloudInit != nil {
				userData, keys = spec.CloudInit.UserData, len(spec.CloudInit.SSHAuthorizedKeys)
			}
			if userData != tt.userData || keys != tt.keys {
				t.Errorf("userData %q with %d ssh keys; want %q with %d", userData, keys, tt.userData, tt.keys)
			}
		})
	}
}
