package qemu

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
)

// hostileImage is an image that refers outside itself, and the field its
// refusal must name.
type hostileImage struct{ path, field string }

// hostileImages builds, with the real qemu-img, images that refer to files
// outside themselves or come in a format that can.
func hostileImages(t *testing.T, qemuImg string) map[string]hostileImage {
	t.Helper()
	dir := t.TempDir()
	hostFile := filepath.Join(dir, "host-secret")
	os.WriteFile(hostFile, []byte("a host file a guest must never read\n"), 0o600)
	mk := func(name string, args ...string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if out, err := exec.Command(qemuImg, append(args, p)...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img %v: %v: %s", args, err, out)
		}
		return p
	}
	out := map[string]hostileImage{}
	out["qcow2 with a backing file"] = hostileImage{mk("backing.qcow2", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", hostFile, "-o", "size=1M"), "backing_file_offset"}
	out["qcow2 with an external data file"] = hostileImage{mk("datafile.qcow2", "create", "-q", "-f", "qcow2", "-o", "data_file="+filepath.Join(dir, "data.raw")+",size=1M"), "data-file"}

	// The same image with the extension renamed to an unknown, ignorable
	// one: the feature bit alone must refuse it.
	b, _ := os.ReadFile(out["qcow2 with an external data file"].path)
	for off := int(binary.BigEndian.Uint32(b[100:])); off+8 <= len(b); {
		typ, length := binary.BigEndian.Uint32(b[off:]), int(binary.BigEndian.Uint32(b[off+4:]))
		if typ == qcow2ExtEnd {
			break
		}
		if typ == qcow2ExtDataFile {
			binary.BigEndian.PutUint32(b[off:], 0x12345678)
		}
		off += 8 + (length+7)&^7
	}
	bitOnly := filepath.Join(dir, "bit-only.qcow2")
	os.WriteFile(bitOnly, b, 0o600)
	out["qcow2 with the data-file feature bit only"] = hostileImage{bitOnly, "incompatible feature data-file"}

	desc := filepath.Join(dir, "desc.vmdk")
	os.WriteFile(desc, []byte("# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType=\"monolithicFlat\"\n\nRW 8 FLAT \""+hostFile+"\" 0\n"), 0o600)
	out["vmdk descriptor naming a host file"] = hostileImage{desc, "vmdk descriptor"}
	// A qcow2 with a backing file hidden behind another format (a vmdk
	// whose extent is that qcow2): the outer format is refused whatever it
	// wraps.
	hidden := filepath.Join(dir, "hidden.vmdk")
	os.WriteFile(hidden, []byte("# Disk DescriptorFile\nversion=1\ncreateType=\"monolithicFlat\"\nRW 2048 FLAT \""+out["qcow2 with a backing file"].path+"\" 0\n"), 0o600)
	out["qcow2 with a backing file behind a vmdk"] = hostileImage{hidden, "vmdk descriptor"}
	out["vmdk (binary)"] = hostileImage{mk("disk.vmdk", "create", "-q", "-f", "vmdk", "-o", "size=1M"), "vmdk"}
	out["vhdx"] = hostileImage{mk("disk.vhdx", "create", "-q", "-f", "vhdx", "-o", "size=1M"), "vhdx"}
	out["qed with a backing file"] = hostileImage{mk("disk.qed", "create", "-q", "-f", "qed", "-F", "raw", "-b", hostFile, "-o", "size=1M"), "qed"}
	out["vdi"] = hostileImage{mk("disk.vdi", "create", "-q", "-f", "vdi", "-o", "size=1M"), "vdi"}
	out["vpc"] = hostileImage{mk("disk.vpc", "create", "-q", "-f", "vpc", "-o", "size=1M"), "vpc"}
	// A LUKS1 header (magic, version 1, cipher, mode, hash; the rest of
	// the phdr zero), written here rather than by `qemu-img create -f
	// luks`, whose key-derivation benchmark fails at random on a loaded
	// machine ("Unable to get accurate CPU usage").
	luks := make([]byte, 1<<20)
	copy(luks, "LUKS\xba\xbe\x00\x01")
	copy(luks[8:], "aes")
	copy(luks[40:], "xts-plain64")
	copy(luks[72:], "sha256")
	lpath := filepath.Join(dir, "disk.luks")
	if err := os.WriteFile(lpath, luks, 0o600); err != nil {
		t.Fatal(err)
	}
	out["luks"] = hostileImage{lpath, "luks"}
	return out
}

func TestInspectImageRefusesExternalReferences(t *testing.T) {
	qemuImg := needQEMUImg(t)
	for name, img := range hostileImages(t, qemuImg) {
		t.Run(name, func(t *testing.T) {
			_, err := inspectImage(img.path)
			if !errors.Is(err, ErrImageNotSelfContained) {
				t.Fatalf("error %v, want ErrImageNotSelfContained", err)
			}
			if !strings.Contains(err.Error(), img.field) {
				t.Errorf("error %q does not name %q", err, img.field)
			}
		})
	}
	dir := t.TempDir()
	for _, tc := range []struct{ format, args string }{{"qcow2", "-f qcow2"}, {"raw", "-f raw"}, {"qcow2", "-f qcow2 -o compat=0.10"}} {
		p := filepath.Join(dir, "good")
		os.Remove(p)
		if out, err := exec.Command(qemuImg, append(append([]string{"create", "-q"}, strings.Fields(tc.args)...), p, "1M")...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if got, err := inspectImage(p); err != nil || got != tc.format {
			t.Errorf("%s: %q, %v; want %s", tc.args, got, err, tc.format)
		}
	}
}

// A hostile image is refused as a permanent error before qemu-img (or
// QEMU) opens it: a qemu-img that logs its calls is never called on it.
func TestPrepareRootDiskRefusesHostileImagesBeforeOpeningThem(t *testing.T) {
	qemuImg := needQEMUImg(t)
	images := hostileImages(t, qemuImg)
	calls := filepath.Join(t.TempDir(), "calls")
	wrapper := filepath.Join(t.TempDir(), "qemu-img")
	os.WriteFile(wrapper, []byte("#!/bin/sh\necho \"$@\" >> "+calls+"\nexec "+qemuImg+" \"$@\"\n"), 0o755)
	srv := newArtifactServer(t)
	p, err := New(Config{CacheDir: t.TempDir(), QEMUImg: wrapper, Artifacts: loopbackPolicy(), Accel: AccelTCG, Logger: quietLog().Logger})
	if err != nil {
		t.Fatal(err)
	}
	for name, img := range images {
		t.Run(name, func(t *testing.T) {
			b, _ := os.ReadFile(img.path)
			art := srv.add("/"+filepath.Base(img.path), b)
			m := agent.Machine{Name: "vm", Dir: t.TempDir(), Spec: desired.VMSpec{DiskGB: 1, Image: &art}}
			err := p.PrepareRootDisk(context.Background(), m)
			if !agent.IsPermanent(err) || !errors.Is(err, ErrImageNotSelfContained) || !strings.Contains(err.Error(), img.field) {
				t.Errorf("error %v, want a permanent ErrImageNotSelfContained naming %q", err, img.field)
			}
			if log, _ := os.ReadFile(calls); strings.Contains(string(log), art.SHA256) {
				t.Errorf("qemu-img opened the hostile image:\n%s", log)
			}
			p.mu.Lock()
			delete(p.machines, "vm")
			p.mu.Unlock()
		})
	}
}
