package qemu

import (
	"bytes"
	"fmt"
	"mime/multipart"
	"net/textproto"
	"os"
	"path/filepath"
	"strings"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/disk"
	"github.com/diskfs/go-diskfs/filesystem"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
	"go.yaml.in/yaml/v3"

	"github.com/gitfleet/gitfleet/desired"
)

// SeedLabel is the volume label cloud-init's NoCloud datasource looks for.
const SeedLabel = "cidata"

// seedFiles renders the NoCloud documents for a VM: meta-data
// (instance-id, local-hostname), user-data (the spec's userData with
// sshAuthorizedKeys merged in) and network-config (version 2, DHCP on the
// NIC whose MAC is mac, or static's addresses when static is not nil).
func seedFiles(name, instanceID, mac string, ci *desired.CloudInit, static *desired.StaticIP) (map[string][]byte, error) {
	meta, err := yaml.Marshal(map[string]string{"instance-id": instanceID, "local-hostname": name})
	if err != nil {
		return nil, err
	}
	nic := map[string]any{
		"match": map[string]string{"macaddress": mac},
		"dhcp4": true,
	}
	applyStatic(nic, static)
	netcfg, err := yaml.Marshal(map[string]any{
		"version":   2,
		"ethernets": map[string]any{"nic0": nic},
	})
	if err != nil {
		return nil, err
	}
	var keys []string
	userData := ""
	if ci != nil {
		keys, userData = ci.SSHAuthorizedKeys, ci.UserData
	}
	ud, err := mergeUserData(userData, keys)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{"meta-data": meta, "user-data": ud, "network-config": netcfg}, nil
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

// mergeUserData adds keys to user-data. A #cloud-config document gets them
// appended to ssh_authorized_keys (kept once each); empty user-data becomes
// a #cloud-config carrying only the keys; any other user-data (a script, a
// MIME archive) is wrapped with a cloud-config part in a multipart/mixed
// archive, which cloud-init reads part by part.
func mergeUserData(userData string, keys []string) ([]byte, error) {
	trimmed := strings.TrimLeft(userData, " \t\r\n")
	switch {
	case trimmed == "":
		doc := map[string]any{}
		if len(keys) > 0 {
			doc["ssh_authorized_keys"] = keys
		}
		return cloudConfig(doc)
	case strings.HasPrefix(trimmed, "#cloud-config"):
		if len(keys) == 0 {
			return []byte(userData), nil
		}
		doc := map[string]any{}
		if err := yaml.Unmarshal([]byte(userData), &doc); err != nil {
			return nil, fmt.Errorf("user-data: parse #cloud-config: %w", secretYAMLError(err))
		}
		if doc == nil {
			doc = map[string]any{}
		}
		var have []string
		switch v := doc["ssh_authorized_keys"].(type) {
		case nil:
		case []any:
			for _, k := range v {
				s, ok := k.(string)
				if !ok {
					return nil, fmt.Errorf("user-data: ssh_authorized_keys holds a %T, want strings", k)
				}
				have = append(have, s)
			}
		default:
			return nil, fmt.Errorf("user-data: ssh_authorized_keys is a %T, want a list", v)
		}
		for _, k := range keys {
			if !contains(have, k) {
				have = append(have, k)
			}
		}
		doc["ssh_authorized_keys"] = have
		return cloudConfig(doc)
	default:
		if len(keys) == 0 {
			return []byte(userData), nil
		}
		keyDoc, err := cloudConfig(map[string]any{"ssh_authorized_keys": keys})
		if err != nil {
			return nil, err
		}
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		fmt.Fprintf(&buf, "Content-Type: multipart/mixed; boundary=\"%s\"\nMIME-Version: 1.0\n\n", mw.Boundary())
		for _, part := range []struct {
			ctype string
			body  []byte
		}{{"text/cloud-config", keyDoc}, {partType(trimmed), []byte(userData)}} {
			w, err := mw.CreatePart(textproto.MIMEHeader{"Content-Type": {part.ctype + `; charset="utf-8"`}})
			if err != nil {
				return nil, err
			}
			w.Write(part.body)
		}
		if err := mw.Close(); err != nil {
			return nil, err
		}
		return buf.Bytes(), nil
	}
}

// partType maps a user-data document's first line to its MIME type as
// cloud-init names them.
func partType(doc string) string {
	switch {
	case strings.HasPrefix(doc, "#!"):
		return "text/x-shellscript"
	case strings.HasPrefix(doc, "#cloud-boothook"):
		return "text/cloud-boothook"
	case strings.HasPrefix(doc, "#include"):
		return "text/x-include-url"
	default:
		return "text/plain"
	}
}

func cloudConfig(doc map[string]any) ([]byte, error) {
	b, err := yaml.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("user-data: %w", err)
	}
	if len(doc) == 0 {
		b = nil
	}
	return append([]byte("#cloud-config\n"), b...), nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
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
	b, err := file.OpenFromPath(path, true)
	if err != nil {
		return "", nil, fmt.Errorf("open seed %s: %w", path, err)
	}
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
