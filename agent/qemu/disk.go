package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/internal/redact"
)

const gib = int64(1) << 30

// artifacts are the cached paths of a spec's downloads; empty when the spec
// has none.
type artifacts struct {
	image, imageFormat string
	kernel, initrd     string
}

// fetchArtifacts downloads (or finds cached) everything spec names and
// checks the image is a self-contained qcow2 or raw disk (inspectImage)
// before any qemu-img or QEMU opens it. The image is skipped (a.image is
// "") for a VM whose root disk exists and is not backed by it: an edited
// image is not applied to an existing VM, so it is neither fetched nor
// allowed to fail the VM's edits and boots.
func (p *Provisioner) fetchArtifacts(ctx context.Context, st *vmState, spec desired.VMSpec) (artifacts, error) {
	var a artifacts
	var err error
	defer st.fetching.Store("")
	fetch := func(art desired.Artifact) (string, error) {
		st.fetching.Store(art.SHA256)
		return p.images.fetch(ctx, art)
	}
	imageKept := false
	if spec.Image != nil {
		imageKept = !p.imageBacksRootDisk(st, *spec.Image)
	}
	if spec.Image != nil && !imageKept {
		if a.image, err = fetch(*spec.Image); err != nil {
			return a, fmt.Errorf("fetch image: %w", err)
		}
		format, err := inspectImage(a.image)
		if errors.Is(err, ErrImageNotSelfContained) {
			return a, agent.Permanent(fmt.Errorf("image %s: %w", redact.URL(spec.Image.URL), err))
		}
		if err != nil {
			return a, err
		}
		// Told its format, qemu-img probes nothing; the header check above
		// made sure it opens no other file.
		info, err := qemuImgInfo(ctx, p.cfg.QEMUImg, a.image, format)
		if err != nil {
			return a, fmt.Errorf("inspect image: %w", err)
		}
		if info.Format != format || info.BackingFilename != "" || info.dataFile() != "" {
			return a, agent.Permanent(fmt.Errorf("image %s: %w: qemu-img reads it as %s (backing %q, data file %q)",
				redact.URL(spec.Image.URL), ErrImageNotSelfContained, info.Format, info.BackingFilename, info.dataFile()))
		}
		a.imageFormat = format
	}
	if spec.Kernel != nil {
		if a.kernel, err = fetch(desired.Artifact{URL: spec.Kernel.URL, SHA256: spec.Kernel.SHA256}); err != nil {
			return a, fmt.Errorf("fetch kernel: %w", err)
		}
		if spec.Kernel.Initrd != nil {
			if a.initrd, err = fetch(*spec.Kernel.Initrd); err != nil {
				return a, fmt.Errorf("fetch initrd: %w", err)
			}
		}
	}
	if a.image == "" && a.kernel == "" && !imageKept && !adopted(spec) {
		return a, agent.Permanent(errors.New("spec has neither image nor kernel: nothing to boot"))
	}
	// Before any disk is made or QEMU started: a guest of another
	// architecture than the host's never boots here.
	return a, p.checkArch(spec, a.kernel)
}

// imageBacksRootDisk reports whether img is the image the VM's root disk
// should be made from or is backed by: true when the VM has no root disk
// yet, or when the disk's backing file is img's place in the cache (so a
// cached image removed by hand is fetched again for the VM it backs).
// When the disk cannot be read it answers true, which fetches the image
// as a create would.
func (p *Provisioner) imageBacksRootDisk(st *vmState, img desired.Artifact) bool {
	d, err := checkRootDisk(st.path(RootDiskFile), p.cfg.CacheDir)
	if err != nil {
		return true
	}
	return d.backing == img.SHA256
}

// Stage fetches and verifies every artifact m.Spec names that the VM
// would use (see fetchArtifacts: not an edited image) and renders m's seed, leaving the VM and its files as
// they are.
func (p *Provisioner) Stage(ctx context.Context, m agent.Machine) error {
	st, err := p.machineState(m)
	if err != nil {
		return err
	}
	if err := p.checkNetwork(m); err != nil {
		return err
	}
	if _, err := p.fetchArtifacts(ctx, st, m.Spec); err != nil {
		return err
	}
	if _, err := p.machineModel(m.Spec); err != nil {
		return err
	}
	// Rendered without the host network's defaults (gateway, DNS), which
	// only attaching the VM to it gives; the rest of the seed is Boot's.
	if adopted(m.Spec) {
		return nil // no seed to render
	}
	if _, err := p.machineSeed(st, m, seedNICs(m, nil)); err != nil {
		return agent.Permanent(fmt.Errorf("seed: %w", err))
	}
	return nil
}

// PrepareRootDisk fetches the spec's artifacts into the cache and creates
// the root disk: a qcow2 overlay on the cached image (backing format given
// explicitly) of max(diskGB, image size), or a blank qcow2 of diskGB for a
// kernel-only spec. A spec with rootDisk.adopt instead takes the disk
// staged for it (adoptRootDisk); qemu-img create never runs for it. An
// existing root disk is never replaced; it is grown
// to diskGB when smaller (online through QMP block_resize while the VM
// runs) and never shrunk.
func (p *Provisioner) PrepareRootDisk(ctx context.Context, m agent.Machine) error {
	st, err := p.machineState(m)
	if err != nil {
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	log := p.log.WithField("vm", m.Name)

	a, err := p.fetchArtifacts(ctx, st, m.Spec)
	if err != nil {
		return err
	}
	want := int64(m.Spec.DiskGB) * gib
	root := st.path(RootDiskFile)
	if _, err := os.Lstat(root); err == nil {
		return p.growRootDisk(ctx, st, want, log)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if adopted(m.Spec) {
		if err := p.adoptRootDisk(st, m.Name, log); err != nil {
			return err
		}
		return p.growRootDisk(ctx, st, want, log)
	}

	partial := root + ".partial"
	os.Remove(partial)
	args := []string{"create", "-q", "-f", "qcow2"}
	size := want
	if a.image != "" {
		info, err := qemuImgInfo(ctx, p.cfg.QEMUImg, a.image, a.imageFormat)
		if err != nil {
			return err
		}
		size = max(size, info.VirtualSize)
		args = append(args, "-F", a.imageFormat, "-b", a.image)
	}
	args = append(args, partial, strconv.FormatInt(size, 10))
	if out, err := exec.CommandContext(ctx, p.cfg.QEMUImg, args...).CombinedOutput(); err != nil {
		os.Remove(partial)
		return fmt.Errorf("qemu-img create: %v: %s", err, trimTail(out, 1024))
	}
	if err := os.Rename(partial, root); err != nil {
		return err
	}
	log.WithFields(logrus.Fields{"bytes": size, "backing": a.image != ""}).Info("root disk created")
	return nil
}

// adopted reports whether spec takes an existing disk (rootDisk.adopt).
func adopted(spec desired.VMSpec) bool { return spec.RootDisk != nil && spec.RootDisk.Adopt }

// adoptRootDisk takes the disk staged for VM name (Config.AdoptedDisk)
// as its root disk, by a rename within the state directory's filesystem:
// no byte of it is copied or written. Its header is checked first, as any
// root disk's (checkRootDisk): a backing file outside the cache, an
// external data file or a disk that is not qcow2 is refused,
// permanently, and the staged disk is left where it is.
func (p *Provisioner) adoptRootDisk(st *vmState, name string, log *logrus.Entry) error {
	if p.cfg.AdoptedDisk == nil {
		return agent.Permanent(errors.New("spec adopts a root disk, and this backend has no adopt directory"))
	}
	staged := p.cfg.AdoptedDisk(name)
	if _, err := checkRootDisk(staged, p.cfg.CacheDir); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w (%s): run gitfleet import --stage on this host", agent.ErrDiskNotStaged, staged)
		}
		if errors.Is(err, ErrImageNotSelfContained) || errors.Is(err, ErrUnsafeFile) {
			return agent.Permanent(fmt.Errorf("adopt: %w", err))
		}
		return err
	}
	if err := os.Rename(staged, st.path(RootDiskFile)); err != nil {
		return fmt.Errorf("adopt root disk: %w", err)
	}
	if err := syncDir(st.dir); err != nil {
		return err
	}
	os.Remove(filepath.Dir(staged)) // the empty adopt/<name> directory
	log.WithField("from", staged).Info("root disk adopted")
	return nil
}

// syncDir makes the renames in dir durable (fsync of the directory).
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// growRootDisk grows the root disk to want bytes when it is smaller. Its
// header is checked first (checkRootDisk): qemu-img opens what it names.
func (p *Provisioner) growRootDisk(ctx context.Context, st *vmState, want int64, log *logrus.Entry) error {
	root := st.path(RootDiskFile)
	d, err := checkRootDisk(root, p.cfg.CacheDir)
	if errors.Is(err, ErrImageNotSelfContained) || errors.Is(err, ErrUnsafeFile) {
		return agent.Permanent(err)
	}
	if err != nil {
		return err
	}
	if d.virtualSize >= want {
		return nil // never shrink
	}
	if p.running(st) {
		if _, err := qmpCommand(ctx, st.path(QMPSocket), "block_resize", map[string]any{"device": "root", "size": want}); err != nil {
			return fmt.Errorf("grow online: %w", err)
		}
	} else if out, err := exec.CommandContext(ctx, p.cfg.QEMUImg, "resize", "-q", "-f", formatQCOW2, root, strconv.FormatInt(want, 10)).CombinedOutput(); err != nil {
		return fmt.Errorf("qemu-img resize: %v: %s", err, trimTail(out, 1024))
	}
	log.WithFields(logrus.Fields{"from": d.virtualSize, "to": want}).Info("root disk grown")
	return nil
}
