package demo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/gitsource"
)

// The demo fleet's names.
const (
	// HostName is the one Host of the demo fleet: this machine.
	HostName = "demo"
	// VolumeName is the demo's one Volume, attached to the first VM.
	VolumeName = "hello-1-data"
	// MainBranch holds the demo fleet's desired state.
	MainBranch = "main"
)

// VMNames are the demo fleet's two VMs, in the order the summary shows them.
var VMNames = []string{"hello-1", "hello-2"}

// Guest names the kernel and initramfs every demo VM boots: file paths
// (absolute) and their sha256 as 64 lowercase hex digits, plus the kernel
// command line.
type Guest struct {
	Kernel, KernelSHA256 string
	Initrd, InitrdSHA256 string
	Cmdline              string
}

// FleetFiles returns the demo fleet as repository files, path → content:
// a README, one Host (hosts/demo.yaml), two VMs of 1 vCPU, 192 MB and a
// 1 GB root disk that boot g by direct kernel boot from file:// URLs
// (vms/hello-1.yaml, vms/hello-2.yaml), and a 1 GB Volume attached to
// hello-1 (volumes/hello-1-data.yaml). Each VM file states "power: running"
// explicitly, so that editing it to "stopped" is a one-word change.
func FleetFiles(g Guest) map[string][]byte {
	files := map[string][]byte{
		"README.md": []byte(fleetReadme),
		"hosts/" + HostName + ".yaml": []byte(fmt.Sprintf(`# This machine. The demo's agent runs the VMs whose spec.host is %q.
apiVersion: gitfleet.dev/v1alpha1
kind: Host
metadata:
  name: %s
spec:
  capacity:
    vcpus: 4
    memoryMB: 1024
`, HostName, HostName)),
		"volumes/" + VolumeName + ".yaml": []byte(fmt.Sprintf(`# A 1 GB data disk for hello-1. It is created once, never resized, and
# deleted only after this file is removed (and a grace period has passed).
apiVersion: gitfleet.dev/v1alpha1
kind: Volume
metadata:
  name: %s
spec:
  host: %s
  sizeGB: 1
`, VolumeName, HostName)),
	}
	for i, name := range VMNames {
		volumes := ""
		if i == 0 {
			volumes = "  volumes: [" + VolumeName + "]\n"
		}
		files["vms/"+name+".yaml"] = []byte(vmYAML(name, g, volumes))
	}
	return files
}

// vmYAML is one demo VM's object file.
func vmYAML(name string, g Guest, volumes string) string {
	return fmt.Sprintf(`# A tiny guest: a Debian kernel and a busybox initramfs that prints its
# seed, disks and network on the serial console. Change "power" to stopped
# (or back), or copy this file to add a VM, then commit and push.
apiVersion: gitfleet.dev/v1alpha1
kind: VM
metadata:
  name: %s
  labels: {app: demo}
spec:
  host: %s
  vcpus: 1
  memoryMB: 192
  diskGB: 1
  power: running
  kernel:
    url: %s
    sha256: %s
    initrd:
      url: %s
      sha256: %s
    cmdline: %q
%s  cloudInit:
    userData: |
      #cloud-config
      hostname: %s
`, name, HostName, fileURL(g.Kernel), g.KernelSHA256, fileURL(g.Initrd), g.InitrdSHA256, g.Cmdline, volumes, name)
}

const fleetReadme = `# The gitfleet demo fleet

Every YAML file here is one object: hosts/ holds this machine, vms/ the two
VMs, volumes/ a data disk. Change a file, commit, push: the controller
publishes a new snapshot for the host and the agent converges the VMs.
The live state is on the branch gitfleet/status (README.md and hosts/).
`

// fileURL is the file:// URL of an absolute path.
func fileURL(path string) string { return "file://" + filepath.ToSlash(path) }

// RepoURL is the file:// URL of the bare repository at path (absolute).
func RepoURL(path string) string { return fileURL(path) }

// SetupRepo makes sure a bare repository exists at path with the demo fleet
// on MainBranch. A new repository (HEAD → main) gets files in one commit;
// an existing one whose main branch exists is left exactly as it is, so
// re-running the demo resumes with whatever was pushed since. It returns the
// repository's file:// URL and whether it committed the fleet.
func SetupRepo(ctx context.Context, path string, files map[string][]byte, log *logrus.Entry) (url string, created bool, err error) {
	if _, err := os.Stat(filepath.Join(path, "HEAD")); errors.Is(err, os.ErrNotExist) {
		if _, err := git.PlainInitWithOptions(path, &git.PlainInitOptions{
			Bare:        true,
			InitOptions: git.InitOptions{DefaultBranch: plumbing.NewBranchReferenceName(MainBranch)},
		}); err != nil {
			return "", false, fmt.Errorf("create demo repository %s: %w", path, err)
		}
	} else if err != nil {
		return "", false, fmt.Errorf("demo repository %s: %w", path, err)
	}
	url = RepoURL(path)
	repo, err := gitsource.Open(ctx, gitsource.Options{URL: url, Committer: "gitfleet demo <demo@localhost>", Logger: log})
	if err != nil {
		return "", false, err
	}
	switch _, err := repo.RemoteHead(ctx, MainBranch); {
	case err == nil:
		return url, false, nil
	case !errors.Is(err, gitsource.ErrBranchNotFound):
		return "", false, fmt.Errorf("demo repository %s: %w", path, err)
	}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	msg := "demo fleet: one host, two VMs, one volume\n\n" + strings.Join(paths, "\n") + "\n"
	if _, err := repo.Update(ctx, MainBranch, func(tip string, _ func(string) ([]byte, error)) (map[string][]byte, string, error) {
		if tip != "" {
			return nil, "", nil // someone else wrote main meanwhile: keep theirs
		}
		return files, msg, nil
	}); err != nil {
		return "", false, fmt.Errorf("commit the demo fleet to %s: %w", path, err)
	}
	return url, true, nil
}
