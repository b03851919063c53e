package qemu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/disk"
	"github.com/diskfs/go-diskfs/filesystem"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
	"go.yaml.in/yaml/v3"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
)

// SeedLabel is the volume label cloud-init's NoCloud datasource looks for.
const SeedLabel = "cidata"

// NICName is the name the seed's network-config gives the VM's NIC: the
// NIC is matched by its MAC and renamed to NICName (set-name), so every
// renderer cloud-init has (netplan, networkd, eni, sysconfig, NetworkManager)
// configures the same, real device on first boot. Without set-name the eni
// and networkd renderers write a config for an interface that does not exist.
const NICName = "nic0"

// nicModel is the QEMU device of a NIC of model m ("" is the default).
func nicModel(m string) string { return desired.NIC{Model: m}.ModelOf() }

// seedFiles renders the NoCloud documents for a VM:
//
//   - meta-data: instance-id, local-hostname, and public-keys (the spec's
//     sshAuthorizedKeys). cloud-init's cc_ssh installs a datasource's
//     public-keys for the default user whatever the user-data's format, so
//     the keys never have to be merged into user-data.
//   - user-data: the spec's userData byte for byte, never parsed or
//     re-encoded (cloud-init reads YAML 1.1 and keeps comments, dates and
//     key order meaningful to the person who wrote them).
//   - network-config: version 2 for the NIC whose MAC is mac, renamed to
//     NICName: DHCP, or static's addresses when static is not nil.
//
// ci's user-data must be plaintext by now (machineSeed opens an encrypted
// one); an encrypted one here is an error, never written as it is.
func seedFiles(name, instanceID, mac string, ci *desired.CloudInit, static *desired.StaticIP) (map[string][]byte, error) {
	return seedFilesNICs(name, instanceID, []seedNIC{{mac: mac, static: static}}, ci)
}

// seedNIC is one NIC as the seed's network-config and QEMU's command line
// know it: its MAC, its static configuration (nil for DHCP) and its QEMU
// device ("" for desired.DefaultNICModel).
type seedNIC struct {
	mac    string
	static *desired.StaticIP
	model  string
}

// nicName is the name network-config gives NIC i: NICName for the
// first, nic1, nic2, ... for the others.
func nicName(i int) string { return "nic" + strconv.Itoa(i) }

// seedFilesNICs is seedFiles for a VM with the NICs nics, at least one:
// network-config has an entry for each, matched by its MAC and named
// nicName(i).
func seedFilesNICs(name, instanceID string, nics []seedNIC, ci *desired.CloudInit) (map[string][]byte, error) {
	var keys []string
	userData := ""
	if ci != nil {
		if ci.EncryptedUserData != nil {
			return nil, errors.New("user-data: encrypted user-data reached the seed unopened")
		}
		keys, userData = ci.SSHAuthorizedKeys, ci.UserData
	}
	meta, err := metaData(name, instanceID, keys)
	if err != nil {
		return nil, err
	}
	ethernets := map[string]any{}
	for i, n := range nics {
		nic := map[string]any{
			"match":    map[string]string{"macaddress": n.mac},
			"set-name": nicName(i),
			"dhcp4":    true,
		}
		applyStatic(nic, n.static)
		ethernets[nicName(i)] = nic
	}
	netcfg, err := yaml11(map[string]any{
		"version":   2,
		"ethernets": ethernets,
	})
	if err != nil {
		return nil, fmt.Errorf("network-config: %w", err)
	}
	return map[string][]byte{"meta-data": meta, "user-data": []byte(userData), "network-config": netcfg}, nil
}

// machineSeed renders m's seed (seedFilesNICs) for its NICs nics with
// its user-data opened (userData).
func (p *Provisioner) machineSeed(st *vmState, m agent.Machine, nics []seedNIC) (map[string][]byte, error) {
	ci := m.Spec.CloudInit
	if ci != nil && ci.EncryptedUserData != nil {
		ud, err := p.userData(st, m)
		if err != nil {
			return nil, err
		}
		ci = &desired.CloudInit{SSHAuthorizedKeys: ci.SSHAuthorizedKeys, UserData: string(ud)}
	}
	return seedFilesNICs(m.Name, m.InstanceID, nics, ci)
}

// userData is the user-data m's seed carries: the spec's userData as
// written, or its encryptedUserData decrypted with Config.AgeIdentity —
// here, when the seed is built, and nowhere else. When this host cannot
// decrypt it but the VM already has a seed of its own instance (created
// before the host's key changed), the user-data of that seed is kept:
// cloud-init read it at first boot, cloudInit is first-boot only, and a
// key that changed must never keep a created VM from booting. Otherwise
// the error is permanent and names keys, never content.
func (p *Provisioner) userData(st *vmState, m agent.Machine) ([]byte, error) {
	ci := m.Spec.CloudInit
	switch {
	case ci == nil:
		return nil, nil
	case ci.EncryptedUserData == nil:
		return []byte(ci.UserData), nil
	}
	plain, err := p.cfg.AgeIdentity.Open(ci.EncryptedUserData.Ciphertext, m.Name)
	if err == nil {
		return plain, nil
	}
	if ud, ok := seedUserData(st.path(SeedFile), m.InstanceID); ok {
		p.log.WithField("vm", m.Name).WithField("recipient", ci.EncryptedUserData.Recipient).WithError(err).
			Warn("encryptedUserData cannot be decrypted on this host; the seed keeps the user-data of the VM's existing seed")
		return ud, nil
	}
	return nil, agent.Permanent(fmt.Errorf("user-data encrypted to %s: %w", ci.EncryptedUserData.Recipient, err))
}

// seedUserData is the user-data of the seed at path when its meta-data
// names instanceID; ok is false when there is no such seed.
func seedUserData(path, instanceID string) ([]byte, bool) {
	if instanceID == "" {
		return nil, false
	}
	if _, err := os.Lstat(path); err != nil {
		return nil, false
	}
	_, files, err := readSeedISO(path)
	if err != nil {
		return nil, false
	}
	var meta struct {
		InstanceID string `yaml:"instance-id"`
	}
	if yaml.Unmarshal(files["meta-data"], &meta) != nil || meta.InstanceID != instanceID {
		return nil, false
	}
	ud, ok := files["user-data"]
	return ud, ok
}

// applyStatic turns a network-config v2 ethernet entry from DHCP to
// static's addresses, default route (gateway4, written as netplan's
// routes) and nameservers. A nil static changes nothing.
func applyStatic(nic map[string]any, static *desired.StaticIP) {
	if static == nil {
		return
	}
	nic["dhcp4"] = false
	nic["addresses"] = static.Addresses
	if static.Gateway4 != "" {
		nic["routes"] = []map[string]string{{"to": "0.0.0.0/0", "via": static.Gateway4}}
	}
	if ns := static.Nameservers; ns != nil && (len(ns.Addresses) > 0 || len(ns.Search) > 0) {
		m := map[string][]string{}
		if len(ns.Addresses) > 0 {
			m["addresses"] = ns.Addresses
		}
		if len(ns.Search) > 0 {
			m["search"] = ns.Search
		}
		nic["nameservers"] = m
	}
}

// metaData renders NoCloud meta-data.
func metaData(name, instanceID string, keys []string) ([]byte, error) {
	doc := struct {
		InstanceID    string   `yaml:"instance-id"`
		LocalHostname string   `yaml:"local-hostname"`
		PublicKeys    []string `yaml:"public-keys,omitempty"`
	}{instanceID, name, keys}
	b, err := yaml11(doc)
	if err != nil {
		return nil, fmt.Errorf("meta-data: %w", err)
	}
	return b, nil
}

// yaml11 renders v as YAML that cloud-init's loader (PyYAML, YAML 1.1)
// reads back as v: every string value is double-quoted. A YAML 1.2 encoder
// leaves strings plain that YAML 1.1 resolves to something else: a MAC
// address such as 52:54:00:12:34:56 is a base-60 integer to YAML 1.1, "no"
// a boolean, 1_000 a number.
func yaml11(v any) ([]byte, error) {
	var doc yaml.Node
	if err := doc.Encode(v); err != nil {
		return nil, err
	}
	quoteStrings(&doc, false)
	return yaml.Marshal(&doc)
}

// quoteStrings double-quotes every string scalar under n that is a value
// (keys are left plain: ours are fixed words YAML 1.1 reads as strings).
func quoteStrings(n *yaml.Node, isKey bool) {
	switch n.Kind {
	case yaml.ScalarNode:
		if !isKey && n.Tag == "!!str" {
			n.Style = yaml.DoubleQuotedStyle
		}
	case yaml.MappingNode:
		for i, c := range n.Content {
			quoteStrings(c, i%2 == 0)
		}
	default:
		for _, c := range n.Content {
			quoteStrings(c, false)
		}
	}
}

// writeSeedISO writes files as an ISO9660 image with Rock Ridge names and
// volume label cidata at path, via path+".partial" and a rename, so a crash
// never leaves a half-written seed under the final name.
func writeSeedISO(path string, files map[string][]byte) error {
	partial := path + ".partial"
	work := path + ".work"
	os.Remove(partial)
	os.RemoveAll(work)
	defer os.RemoveAll(work)
	if err := os.Mkdir(work, 0o700); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	var size int64 = 1 << 20
	for _, b := range files {
		size += int64(len(b)) + 4096
	}
	d, err := diskfs.Create(partial, size, diskfs.SectorSizeDefault)
	if err != nil {
		return fmt.Errorf("seed: create %s: %w", partial, err)
	}
	defer d.Close()
	d.LogicalBlocksize = 2048
	fs, err := d.CreateFilesystem(disk.FilesystemSpec{
		Partition: 0, FSType: filesystem.TypeISO9660, VolumeLabel: SeedLabel, WorkDir: work,
	})
	if err != nil {
		return fmt.Errorf("seed: create filesystem: %w", err)
	}
	for name, content := range files {
		f, err := fs.OpenFile(name, os.O_CREATE|os.O_RDWR)
		if err != nil {
			return fmt.Errorf("seed: add %s: %w", name, err)
		}
		_, err = f.Write(content)
		f.Close()
		if err != nil {
			return fmt.Errorf("seed: add %s: %w", name, err)
		}
	}
	iso, ok := fs.(*iso9660.FileSystem)
	if !ok {
		return fmt.Errorf("seed: not an ISO9660 filesystem: %T", fs)
	}
	if err := iso.Finalize(iso9660.FinalizeOptions{RockRidge: true, VolumeIdentifier: SeedLabel}); err != nil {
		return fmt.Errorf("seed: finalize: %w", err)
	}
	if err := os.Rename(partial, path); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	return nil
}

// readSeedISO reads the files of a seed image back (used to verify a seed
// and by tests).
func readSeedISO(path string) (label string, files map[string][]byte, err error) {
	f, err := openRegular(path, os.O_RDONLY, 0)
	if err != nil {
		return "", nil, fmt.Errorf("open seed: %w", err)
	}
	b := file.New(f, true)
	defer b.Close()
	fi, err := b.Stat()
	if err != nil {
		return "", nil, fmt.Errorf("open seed %s: %w", path, err)
	}
	fs, err := iso9660.Read(b, fi.Size(), 0, 2048)
	if err != nil {
		return "", nil, fmt.Errorf("open seed %s: %w", path, err)
	}
	entries, err := fs.ReadDir(".")
	if err != nil {
		return "", nil, fmt.Errorf("read seed %s: %w", path, err)
	}
	files = map[string][]byte{}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := fs.ReadFile(e.Name())
		if err != nil {
			return "", nil, fmt.Errorf("read seed %s: %s: %w", path, e.Name(), err)
		}
		files[filepath.Base(e.Name())] = b
	}
	return strings.Trim(fs.Label(), "\x00 "), files, nil
}
