package qemu

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
)

var _ agent.ImageCollector = (*Provisioner)(nil)

// CollectImages implements agent.ImageCollector. An artifact is in use
// when a spec of vms names it (image, kernel, initrd) or the root disk of
// a VM of vms has it as backing file (read with qemu-img info, one level:
// cached images are self-contained, see inspectImage); a download in
// flight is in use too. Each in-use artifact's modification time is set to
// now, so an artifact's age is the time since it was last seen in use; an
// artifact not in use and older than grace is removed. A root disk that
// exists but cannot be read fails the pass before anything is removed.
func (p *Provisioner) CollectImages(ctx context.Context, vms []agent.Machine, grace time.Duration) (agent.ImageCollection, error) {
	inUse := map[string]bool{}
	for _, m := range vms {
		for _, sum := range specArtifacts(m.Spec) {
			inUse[sum] = true
		}
		dir := m.Dir
		if dir == "" && p.cfg.MachineDir != nil {
			dir = p.cfg.MachineDir(m.Name)
		}
		if dir == "" {
			return agent.ImageCollection{}, fmt.Errorf("image cache: the directory of VM %s is unknown; nothing collected", m.Name)
		}
		backing, err := p.backingArtifact(filepath.Join(dir, RootDiskFile))
		if err != nil {
			return agent.ImageCollection{}, fmt.Errorf("image cache: VM %s: %w; nothing collected", m.Name, err)
		}
		if backing != "" {
			inUse[backing] = true
		}
	}
	return p.images.collect(inUse, grace, time.Now())
}

// specArtifacts lists the sha256 of every artifact spec names.
func specArtifacts(spec desired.VMSpec) []string {
	var out []string
	if spec.Image != nil {
		out = append(out, spec.Image.SHA256)
	}
	if spec.Kernel != nil {
		out = append(out, spec.Kernel.SHA256)
		if spec.Kernel.Initrd != nil {
			out = append(out, spec.Kernel.Initrd.SHA256)
		}
	}
	return out
}

// backingArtifact returns the sha256 name of the cached artifact the qcow2
// at root is backed by: "" when root does not exist or has no backing file.
// The header is read in Go (checkRootDisk), never by qemu-img.
func (p *Provisioner) backingArtifact(root string) (string, error) {
	d, err := checkRootDisk(root, p.cfg.CacheDir)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read root disk: %w", err)
	}
	return d.backing, nil
}

// collect removes the cached artifacts that are not in inUse, not being
// downloaded, and were last modified (last seen in use) grace or more
// before now; it touches the ones in use. It holds c.mu, as fetch does
// when it finds an artifact cached, so an artifact fetch has just
// returned is never removed under it.
func (c *imageCache) collect(inUse map[string]bool, grace time.Duration, now time.Time) (agent.ImageCollection, error) {
	var res agent.ImageCollection
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.inflight {
		inUse[k.sum] = true
	}
	ents, err := os.ReadDir(c.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return res, nil
	}
	if err != nil {
		return res, fmt.Errorf("image cache: %w", err)
	}
	var errs []error
	for _, ent := range ents {
		sum := ent.Name()
		if !sha256Hex.MatchString(sum) || !ent.Type().IsRegular() {
			continue // temporaries and anything not ours
		}
		path := c.path(sum)
		info, err := os.Lstat(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if inUse[sum] {
			if err := os.Chtimes(path, time.Time{}, now); err != nil {
				errs = append(errs, err)
			}
			res.Kept++
			res.KeptBytes += info.Size()
			continue
		}
		if now.Sub(info.ModTime()) < grace {
			res.Kept++
			res.KeptBytes += info.Size()
			continue
		}
		if err := os.Remove(path); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(c.verified, sum)
		res.Removed = append(res.Removed, sum)
		res.RemovedBytes += info.Size()
	}
	sort.Strings(res.Removed)
	if err := errors.Join(errs...); err != nil {
		return res, fmt.Errorf("image cache: %w", err)
	}
	return res, nil
}
