package qemu

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/gitfleet/gitfleet/agent"
)

// UEFIVarsFile is the VM's own UEFI variables store in its directory:
// a copy of the firmware's variables template made at the VM's first UEFI
// boot and never overwritten, so boot entries and Secure Boot keys the
// guest writes survive restarts, agent restarts and upgrades.
const UEFIVarsFile = "uefi-vars.fd"

// DefaultFirmwareDirs are where QEMU's firmware descriptors are read from
// (QEMU's docs/interop/firmware.json), most specific first: a descriptor
// in an earlier directory replaces one of the same file name in a later
// one, and an empty file there hides it, as QEMU and libvirt read them.
var DefaultFirmwareDirs = []string{"/etc/qemu/firmware", "/usr/share/qemu/firmware"}

// maxDescriptor bounds one firmware descriptor file, in bytes.
const maxDescriptor = 64 << 10

// ErrNoFirmware is wrapped when no firmware descriptor fits what a VM
// asks for (UEFI, Secure Boot, its architecture and machine): the host
// lacks the package (ovmf, qemu-efi-aarch64), a permanent error until
// the host or the spec changes.
var ErrNoFirmware = errors.New("no UEFI firmware fits")

// firmwareDescriptor is the part of a QEMU firmware descriptor the
// backend reads.
type firmwareDescriptor struct {
	Description    string   `json:"description"`
	InterfaceTypes []string `json:"interface-types"`
	Mapping        struct {
		Device     string `json:"device"`
		Executable struct {
			Filename string `json:"filename"`
			Format   string `json:"format"`
		} `json:"executable"`
		NVRAMTemplate struct {
			Filename string `json:"filename"`
			Format   string `json:"format"`
		} `json:"nvram-template"`
	} `json:"mapping"`
	Targets []struct {
		Architecture string   `json:"architecture"`
		Machines     []string `json:"machines"`
	} `json:"targets"`
	Features []string `json:"features"`
}

// uefiFirmware is the firmware chosen for a VM: the code image, mapped
// read-only as the first pflash unit, and the variables template its
// UEFIVarsFile is made from, both in format ("raw" or "qcow2"). smm says
// the build requires SMM (a Secure Boot build on x86: the machine gets
// smm=on and the flash is secure).
type uefiFirmware struct {
	descriptor string // the descriptor's path, for logs and errors
	code, vars string
	format     string
	smm        bool
}

// selectFirmware picks, from the descriptors in dirs, the first by file
// name whose interface is uefi on flash with a variables template, that
// targets qemuArch (x86_64, aarch64) and machine, and that has Secure
// Boot with enrolled keys when secureBoot is set and no Secure Boot when
// it is not. A descriptor that does not parse, or whose files are
// missing, is skipped. machine "q35" and "virt" are QEMU's aliases of
// the newest pc-q35-* and virt-* machines the descriptors' globs name.
func selectFirmware(dirs []string, qemuArch, machine string, secureBoot bool) (uefiFirmware, error) {
	var skipped []string
	for _, file := range descriptorFiles(dirs) {
		d, err := readDescriptor(file)
		if err != nil {
			skipped = append(skipped, err.Error())
			continue
		}
		if !d.fits(qemuArch, machine, secureBoot) {
			continue
		}
		fw := uefiFirmware{descriptor: file, code: d.Mapping.Executable.Filename, vars: d.Mapping.NVRAMTemplate.Filename,
			format: d.Mapping.Executable.Format, smm: slices.Contains(d.Features, "requires-smm")}
		if fw.format == "" {
			fw.format = formatRaw
		}
		if err := fw.present(); err != nil {
			skipped = append(skipped, fmt.Sprintf("%s: %v", file, err))
			continue
		}
		return fw, nil
	}
	sb := "without Secure Boot"
	if secureBoot {
		sb = "with Secure Boot and enrolled keys"
	}
	why := ""
	if len(skipped) > 0 {
		why = "; skipped: " + strings.Join(skipped, "; ")
	}
	return uefiFirmware{}, fmt.Errorf("%w: UEFI %s for %s machine %s in %s (install ovmf or qemu-efi-aarch64)%s", ErrNoFirmware, sb, qemuArch, machine, strings.Join(dirs, ", "), why)
}

// descriptorFiles lists the *.json files of dirs ordered by file name, a
// name in an earlier directory replacing the same name in later ones; an
// empty file hides the name.
func descriptorFiles(dirs []string) []string {
	byName := map[string]string{}
	for i := len(dirs) - 1; i >= 0; i-- {
		es, err := os.ReadDir(dirs[i])
		if err != nil {
			continue
		}
		for _, e := range es {
			if strings.HasSuffix(e.Name(), ".json") {
				byName[e.Name()] = filepath.Join(dirs[i], e.Name())
			}
		}
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	files := make([]string, 0, len(names))
	for _, n := range names {
		if fi, err := os.Stat(byName[n]); err == nil && fi.Size() > 0 {
			files = append(files, byName[n])
		}
	}
	return files
}

// readDescriptor reads one descriptor, at most maxDescriptor bytes.
func readDescriptor(file string) (*firmwareDescriptor, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxDescriptor+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if len(b) > maxDescriptor {
		return nil, fmt.Errorf("%s: larger than %d bytes", file, maxDescriptor)
	}
	var d firmwareDescriptor
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return &d, nil
}

// fits reports whether d is UEFI on flash with a variables template for
// qemuArch and machine, with or without Secure Boot as asked.
func (d *firmwareDescriptor) fits(qemuArch, machine string, secureBoot bool) bool {
	if !slices.Contains(d.InterfaceTypes, "uefi") || d.Mapping.Device != "flash" ||
		d.Mapping.Executable.Filename == "" || d.Mapping.NVRAMTemplate.Filename == "" {
		return false
	}
	if f := d.Mapping.Executable.Format; f != "" && f != formatRaw && f != formatQCOW2 {
		return false
	}
	sb := slices.Contains(d.Features, "secure-boot")
	switch {
	case secureBoot && !(sb && slices.Contains(d.Features, "enrolled-keys")):
		return false
	case !secureBoot && sb:
		return false
	}
	// Confidential-computing builds boot no ordinary guest.
	for _, f := range d.Features {
		if f == "amd-sev-es" || f == "amd-sev-snp" || f == "intel-tdx" {
			return false
		}
	}
	concrete := map[string]string{"q35": "pc-q35-99.0", "virt": "virt-99.0"}[machine]
	for _, t := range d.Targets {
		if t.Architecture != qemuArch {
			continue
		}
		for _, glob := range t.Machines {
			if ok, _ := path.Match(glob, machine); ok {
				return true
			}
			if ok, _ := path.Match(glob, concrete); ok && concrete != "" {
				return true
			}
		}
	}
	return false
}

// present checks that the firmware's code image and template exist.
func (fw uefiFirmware) present() error {
	for _, f := range []string{fw.code, fw.vars} {
		if _, err := os.Stat(f); err != nil {
			return err
		}
	}
	return nil
}

// ensureVars makes the VM's UEFIVarsFile in dir from fw's template when
// there is none, and never overwrites one: it holds what the guest wrote.
// An existing file must be a regular file with one link (openRegular) of
// the template's size; anything else is a permanent error, never a fresh
// copy, since that would drop the guest's boot entries and keys.
func ensureVars(dir string, fw uefiFirmware) error {
	vars := filepath.Join(dir, UEFIVarsFile)
	tmpl, err := os.Stat(fw.vars)
	if err != nil {
		return fmt.Errorf("UEFI variables template: %w", err)
	}
	f, err := openRegular(vars, os.O_RDONLY, 0)
	switch {
	case err == nil:
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		if fi.Size() != tmpl.Size() {
			return agent.Permanent(fmt.Errorf("%s is %d bytes, but the firmware's template %s is %d: it is kept as it is, never replaced (restore it, or remove it to start from the template)", vars, fi.Size(), fw.vars, tmpl.Size()))
		}
		return nil
	case errors.Is(err, ErrUnsafeFile):
		return agent.Permanent(fmt.Errorf("UEFI variables: %w", err))
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("UEFI variables: %w", err)
	}
	return copyTemplate(fw.vars, vars)
}

// copyTemplate copies the template src to dst through dst.partial and a
// hard link, which fails rather than replace a dst that appeared.
func copyTemplate(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("UEFI variables template: %w", err)
	}
	defer in.Close()
	tmp := dst + ".partial"
	out, err := createRegular(tmp, 0o600)
	if err != nil {
		return fmt.Errorf("UEFI variables: %w", err)
	}
	defer os.Remove(tmp)
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Link(tmp, dst)
	}
	if err != nil {
		return fmt.Errorf("UEFI variables: %w", err)
	}
	return nil
}
