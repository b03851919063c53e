package qemu

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/cloudinittest"
)

// userDataExamples are the user-data documents of testdata/userdata: each
// format cloud-init reads that a person is likely to write by hand.
func userDataExamples(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{"empty": ""}
	for _, name := range []string{"cloud-config", "archive", "mime", "script"} {
		b, err := os.ReadFile(filepath.Join("testdata", "userdata", name+".txt"))
		if err != nil {
			t.Fatal(err)
		}
		out[name] = string(b)
	}
	return out
}

// TestSeedCarriesUserDataByteForByte pins that user-data reaches the seed
// exactly as written, in every format and with sshAuthorizedKeys set: the
// keys travel in meta-data, never merged into user-data.
func TestSeedCarriesUserDataByteForByte(t *testing.T) {
	keys := []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKey1 a@b", "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQKey2 c@d"}
	metas := map[string][]byte{}
	for name, ud := range userDataExamples(t) {
		t.Run(name, func(t *testing.T) {
			files, err := seedFiles("web-01", "web-01-0123", macFor("web-01"), &desired.CloudInit{SSHAuthorizedKeys: keys, UserData: ud}, nil)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), SeedFile)
			if err := writeSeedISO(path, files); err != nil {
				t.Fatal(err)
			}
			_, got, err := readSeedISO(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got["user-data"], []byte(ud)) {
				t.Errorf("user-data in the seed differs from the spec's:\n got %q\nwant %q", got["user-data"], ud)
			}
			metas[name] = got["meta-data"]
		})
	}
	var names []string
	var docs [][]byte
	for name, md := range metas {
		names, docs = append(names, name), append(docs, md)
	}
	for i, md := range cloudInitLoad(t, docs...) {
		if md["instance-id"] != "web-01-0123" || md["local-hostname"] != "web-01" {
			t.Errorf("%s: meta-data as cloud-init reads it: %v", names[i], md)
		}
		if pk, _ := json.Marshal(md["public-keys"]); string(pk) != mustJSON(t, keys) {
			t.Errorf("%s: meta-data public-keys as cloud-init reads them: %s, want %s", names[i], pk, mustJSON(t, keys))
		}
	}
}

// TestSeedStringsSurviveYAML11 pins that meta-data and network-config read
// back, through cloud-init's own loader, as the strings gitfleet wrote,
// including those YAML 1.1 resolves to something else when left plain.
func TestSeedStringsSurviveYAML11(t *testing.T) {
	names := []string{"no", "on", "1e3", "2001-12-14", "0777", "web-01"}
	var docs [][]byte
	for _, name := range names {
		files, err := seedFiles(name, name, "52:54:00:12:34:56", nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, files["meta-data"], files["network-config"])
	}
	read := cloudInitLoad(t, docs...)
	for i, name := range names {
		md, nc := read[2*i], read[2*i+1]
		if md["instance-id"] != name || md["local-hostname"] != name {
			t.Errorf("name %q: meta-data reads back as %v", name, md)
		}
		if _, ok := md["public-keys"]; ok {
			t.Errorf("name %q: public-keys present without keys: %v", name, md)
		}
		nic, _ := nc["ethernets"].(map[string]any)[NICName].(map[string]any)
		if mac := nic["match"].(map[string]any)["macaddress"]; mac != "52:54:00:12:34:56" {
			t.Errorf("network-config macaddress reads back as %v (%T)", mac, mac)
		}
	}
}

// TestNetworkConfigRendersForEveryRenderer renders the seed's
// network-config with each of cloud-init's renderers (net-convert: eni,
// networkd, netplan, sysconfig, NetworkManager) and checks each configures
// DHCP on the interface that is the VM's NIC: matched by its MAC, renamed
// to NICName.
func TestNetworkConfigRendersForEveryRenderer(t *testing.T) {
	ci, err := exec.LookPath("cloud-init")
	if err != nil {
		t.Skip("cloud-init not installed (scripts/install-deps.sh installs it)")
	}
	mac := macFor("web-01")
	files, err := seedFiles("web-01", "web-01-0123", mac, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	netcfg := filepath.Join(dir, "network-config")
	if err := os.WriteFile(netcfg, files["network-config"], 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		renderer, distro string
		want             map[string][]string // file -> substrings
	}{
		{"eni", "debian", map[string][]string{
			"etc/network/interfaces.d/50-cloud-init":   {"auto " + NICName + "\n", "iface " + NICName + " inet dhcp"},
			"etc/udev/rules.d/70-persistent-net.rules": {`ATTR{address}=="` + mac + `", NAME="` + NICName + `"`},
		}},
		{"networkd", "debian", map[string][]string{
			"etc/systemd/network/10-cloud-init-" + NICName + ".network": {"MACAddress=" + mac, "Name=" + NICName, "DHCP=ipv4"},
		}},
		{"netplan", "ubuntu", map[string][]string{
			"etc/netplan/50-cloud-init.yaml": {"macaddress: " + mac, "set-name: " + NICName, "dhcp4: true"},
		}},
		{"sysconfig", "centos", map[string][]string{
			"etc/sysconfig/network-scripts/ifcfg-" + NICName: {"DEVICE=" + NICName, "HWADDR=" + mac, "BOOTPROTO=dhcp"},
		}},
		{"network-manager", "centos", map[string][]string{
			"etc/NetworkManager/system-connections/cloud-init-" + NICName + ".nmconnection": {"mac-address=" + strings.ToUpper(mac), "method=auto"},
		}},
	} {
		t.Run(tc.renderer, func(t *testing.T) {
			out := filepath.Join(dir, tc.renderer)
			cmd := exec.Command(ci, "devel", "net-convert", "-p", netcfg, "-k", "yaml", "-d", out, "-D", tc.distro, "-O", tc.renderer)
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("net-convert: %v: %s", err, b)
			}
			for file, wants := range tc.want {
				b, err := os.ReadFile(filepath.Join(out, file))
				if err != nil {
					t.Fatalf("%s renderer wrote no %s: %v", tc.renderer, file, err)
				}
				for _, w := range wants {
					if !strings.Contains(string(b), w) {
						t.Errorf("%s: %s lacks %q:\n%s", tc.renderer, file, w, b)
					}
				}
			}
		})
	}
}

// cloudInitLoad reads YAML documents with cloud-init's own loader
// (cloudinit.util.load_yaml, PyYAML under YAML 1.1), in one interpreter,
// and returns each as JSON decodes it.
func cloudInitLoad(t *testing.T, docs ...[]byte) []map[string]any {
	t.Helper()
	const script = `import sys, json
from cloudinit import util
docs = json.load(sys.stdin)
json.dump([util.load_yaml(d) for d in docs], sys.stdout, default=lambda o: "NOT A STRING: %r" % (o,))`
	in := make([]string, len(docs))
	for i, d := range docs {
		in[i] = string(d)
	}
	out := cloudinittest.Run(t, script, in)
	var v []map[string]any
	if err := json.Unmarshal(out, &v); err != nil || len(v) != len(docs) {
		t.Fatalf("cloud-init load_yaml gave %s: %v", out, err)
	}
	return v
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
