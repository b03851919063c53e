package tinyguest

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// wantModules are the drivers the guest's /init needs: virtio PCI, disk and
// net, ISO9660 and FAT for the NoCloud seed, the ACPI power button with
// evdev so an ACPI powerdown from the host reaches it, and virtio_console
// for the virtio-serial ports (/dev/vportNpM, the guest agent's channel
// among them), which a seed's script may write to, and efivarfs, through
// which a seed's script reads and writes UEFI variables when the guest
// booted under UEFI. Those built into the kernel (listed in
// modules.builtin) are skipped.
var wantModules = []string{
	"virtio_pci", "virtio_blk", "virtio_net", "isofs", "vfat", "button", "evdev", "virtio_console", "efivarfs",
}

// modName normalizes a module name as the kernel does: '-' and '_' are one.
func modName(s string) string { return strings.ReplaceAll(s, "-", "_") }

// moduleSet indexes the modules of one kernel release directory
// (lib/modules/<release>).
type moduleSet struct {
	paths   map[string]string // name -> absolute path of the .ko
	builtin map[string]bool
}

func loadModuleSet(dir string) (*moduleSet, error) {
	ms := &moduleSet{paths: map[string]string{}, builtin: map[string]bool{}}
	err := filepath.WalkDir(filepath.Join(dir, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".ko") {
			ms.paths[modName(strings.TrimSuffix(d.Name(), ".ko"))] = p
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("index modules in %s: %w", dir, err)
	}
	if len(ms.paths) == 0 {
		return nil, fmt.Errorf("index modules in %s: no uncompressed .ko files", dir)
	}
	if f, err := os.Open(filepath.Join(dir, "modules.builtin")); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			base := filepath.Base(strings.TrimSpace(sc.Text()))
			ms.builtin[modName(strings.TrimSuffix(base, ".ko"))] = true
		}
		f.Close()
	}
	return ms, nil
}

// depends reads the "depends=" entry of a module's .modinfo ELF section.
func depends(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read module %s: %w", path, err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("read module %s: no .modinfo section", path)
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("read module %s: %w", path, err)
	}
	var deps []string
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok && len(v) > 0 {
			for _, d := range strings.Split(string(v), ",") {
				deps = append(deps, modName(d))
			}
		}
	}
	return deps, nil
}

// closure returns the modules to load for want, dependencies first, each
// once; built-in modules are left out.
func (ms *moduleSet) closure(want []string) ([]string, error) {
	var order []string
	seen := map[string]bool{}
	var visit func(name string, chain []string) error
	visit = func(name string, chain []string) error {
		name = modName(name)
		if seen[name] || ms.builtin[name] {
			return nil
		}
		path, ok := ms.paths[name]
		if !ok {
			return fmt.Errorf("module %s (needed by %v) is neither built in nor shipped", name, chain)
		}
		seen[name] = true
		deps, err := depends(path)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d, append(chain, name)); err != nil {
				return err
			}
		}
		order = append(order, name)
		return nil
	}
	for _, w := range want {
		if err := visit(w, nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}
