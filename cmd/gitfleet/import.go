package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gitfleet/gitfleet/adopt"
	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/cmd/gitfleet/internal/config"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
)

// importArgs are import's settings: the source (a libvirt domain's XML,
// or a disk with its sizes), the VM's Host, name and network, where the
// objects go (repository, base branch, new branch, directory) and
// whether to stage the disk on this host.
type importArgs struct {
	repo                config.Repo
	base, branch, path  string
	libvirtXML, disk    string
	host, name, network string
	mac                 string
	cpus, memoryMB      int
	stage               bool
	stateDir, qemuImg   string
	acceptLoss          bool
}

func newImportCmd() *cobra.Command {
	a := importArgs{base: "main", stateDir: agent.DefaultStateDir, qemuImg: "qemu-img"}
	cmd := &cobra.Command{
		Use:   "import (--libvirt-xml FILE | --disk FILE --name VM --cpus N --memory MIB) --host HOST [--repo R] [--stage]",
		Short: "Bring a VM that runs outside gitfleet into the fleet, keeping its disk and MAC",
		Long: `Import maps an existing VM to a VM object that adopts its disk
(spec.rootDisk.adopt) and keeps its MAC (spec.mac), and prints, field by
field, what it mapped and what gitfleet cannot express. The source is a
libvirt domain's XML (virsh dumpxml NAME, or /etc/libvirt/qemu/NAME.xml;
no libvirtd is needed), or a bare qcow2 disk with --name, --cpus, --memory
(MiB) and, to keep the guest's network identity, --mac.

UEFI firmware, Secure Boot, a TPM, the machine type and a host-passthrough
CPU map to firmware, secureBoot, tpm, machine and cpuModel; the UEFI
variables are not carried (the VM starts with fresh ones). What would cost
the guest its boot or data (a passthrough device, a TPM's state, a disk
that is not a file) blocks the import unless
--accept-loss. The original must not run: a domain libvirt runs (its XML
has an id) and a disk another process locks (a QEMU that has it open)
are refused. The disk must be a self-contained qcow2.

With --repo, the VM file (vms/<name>.yaml under --path) is validated
against the fleet at --base (refused when a file of that path is there
already: a VM of that name) and written as one commit on a new branch
(--branch, default import/<name>) for review; --base is not touched.
With --stage, run on the VM's host as root, the disk is moved into the
agent's state directory (<state-dir>/adopt/<name>/root.qcow2): by a
rename when that is on the disk's filesystem (the disk leaves its old
path; no byte is copied), else by a reflink clone or a copy checked by
sha256 (the original stays). The agent takes it from there when the VM is
created and never runs qemu-img create or writes a NoCloud seed for it.
A failure after staging (the branch could not be written) puts the disk
back. Run again after a rename (the original gone, the disk staged), it
says "already staged at PATH", reads the staged disk and leaves it. The VM file names no host path.

Without --repo and --stage, the VM file is printed.

Exit status: 0 when done, 1 when refused (running, blocking fields, a
disk that cannot be adopted, a file that does not validate) or git or the
disk failed, 2 for usage errors.`,
		Args: cobra.NoArgs,
	}
	flags := config.NewFlags(cmd.Flags())
	a.repo.Bind(flags)
	flags.String(&a.path, "path", "GITFLEET_PATH", "directory of the objects in the repository")
	f := cmd.Flags()
	f.StringVar(&a.base, "base", a.base, "branch the new branch starts from")
	f.StringVar(&a.branch, "branch", "", "branch to write (default import/<name>); it must not exist")
	f.StringVar(&a.libvirtXML, "libvirt-xml", "", "a libvirt domain's XML file")
	f.StringVar(&a.disk, "disk", "", "a qcow2 disk to adopt, without a libvirt domain")
	f.StringVar(&a.host, "host", "", "the Host the VM runs on (required)")
	f.StringVar(&a.name, "name", "", "the VM's name (default: the domain's)")
	f.StringVar(&a.network, "network", "", "the Host network the NIC joins (default: the libvirt network's name)")
	f.StringVar(&a.mac, "mac", "", "the NIC's MAC, with --disk")
	f.IntVar(&a.cpus, "cpus", 0, "vCPUs, with --disk")
	f.IntVar(&a.memoryMB, "memory", 0, "memory in MiB, with --disk")
	f.BoolVar(&a.stage, "stage", false, "move the disk into the agent's state directory on this host")
	f.StringVar(&a.stateDir, "state-dir", a.stateDir, "the agent's state directory (its stateDir), with --stage")
	f.StringVar(&a.qemuImg, "qemu-img", a.qemuImg, "the qemu-img binary")
	f.BoolVar(&a.acceptLoss, "accept-loss", false, "import even when fields that block (passthrough, a TPM's state, a disk that is not a file) would be lost")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := flags.FromEnv(config.OS); err != nil {
			return usageOr(err)
		}
		if err := a.check(); err != nil {
			return &exitError{code: 2, err: err}
		}
		return runImport(cmd.Context(), cmd.OutOrStdout(), a)
	}
	return cmd
}

// check refuses contradictory or missing flags.
func (a importArgs) check() error {
	switch {
	case a.host == "":
		return errors.New("--host is required")
	case (a.libvirtXML == "") == (a.disk == ""):
		return errors.New("give one of --libvirt-xml and --disk")
	case a.disk != "" && (a.name == "" || a.cpus <= 0 || a.memoryMB <= 0):
		return errors.New("--disk needs --name, --cpus and --memory")
	case a.libvirtXML != "" && (a.cpus != 0 || a.memoryMB != 0 || a.mac != ""):
		return errors.New("--cpus, --memory and --mac are for --disk; a domain's XML gives them")
	}
	return nil
}

// plan reads the source into an adopt.Plan.
func (a importArgs) plan() (*adopt.Plan, error) {
	opts := adopt.Options{Host: a.host, Name: a.name, Network: a.network}
	if a.disk != "" {
		return adopt.FromDisk(a.disk, a.cpus, a.memoryMB, a.mac, opts)
	}
	data, err := os.ReadFile(a.libvirtXML)
	if err != nil {
		return nil, err
	}
	return adopt.FromLibvirt(a.libvirtXML, data, opts)
}

// runImport is import's steps in order: map, report, refuse what blocks
// or runs, render, validate against the base, stage, write the branch
// (putting the disk back when that fails).
func runImport(ctx context.Context, out io.Writer, a importArgs) error {
	p, err := a.plan()
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	if a.stage {
		// A run again after a rename: the disk is where Stage put it.
		if _, err := p.UseStaged(a.stateDir); err != nil {
			return &exitError{code: 1, err: err}
		}
	}
	if err := adopt.Inspect(ctx, p, a.qemuImg); err != nil {
		fmt.Fprint(out, p.ReportText())
		return &exitError{code: 1, err: err}
	}
	fmt.Fprint(out, p.ReportText())
	if b := p.Blocking(); len(b) > 0 && !a.acceptLoss {
		return &exitError{code: 1, err: fmt.Errorf("%s would cost the guest its boot or data (see above); --accept-loss to import anyway", plural(len(b), "field", "fields"))}
	}
	files, err := p.Files(a.path)
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	if a.repo.URL == "" && !a.stage {
		printFiles(out, files)
		return nil
	}
	var repo *gitsource.Repo
	if a.repo.URL != "" {
		var done func()
		if repo, done, err = openScratch(ctx, gitsource.Options{URL: a.repo.URL, Auth: a.repo.Auth()}); err != nil {
			return &exitError{code: 1, err: err}
		}
		defer done()
		if err := validateImport(ctx, out, repo, a, files); err != nil {
			return err
		}
	}
	return stageAndWrite(ctx, out, repo, a, p, files)
}

// printFiles prints each file under a "--- PATH" line, in path order.
func printFiles(out io.Writer, files map[string][]byte) {
	for _, name := range slices.Sorted(maps.Keys(files)) {
		fmt.Fprintf(out, "\n--- %s\n%s", name, files[name])
	}
}

// stageAndWrite stages the disk (with --stage) and writes the branch
// (with a repository); when the branch cannot be written, the disk is put
// back where it was.
func stageAndWrite(ctx context.Context, out io.Writer, repo *gitsource.Repo, a importArgs, p *adopt.Plan, files map[string][]byte) error {
	var staged []adopt.Staged
	if a.stage {
		var err error
		if staged, err = adopt.StagePlan(p, a.stateDir); err != nil {
			return &exitError{code: 1, err: err}
		}
		fmt.Fprintln(out)
		for _, s := range staged {
			if s.Method == adopt.MethodAlready {
				fmt.Fprintf(out, "already staged at %s (by an earlier --stage; nothing moved)\n", s.Path)
				continue
			}
			fmt.Fprintf(out, "staged %s at %s (%s)\n", s.Original, s.Path, stagedHow(s.Method))
		}
	}
	if repo == nil {
		fmt.Fprintf(out, "no --repo: add these files to the fleet repository yourself:\n")
		printFiles(out, files)
		return nil
	}
	branch := a.branch
	if branch == "" {
		branch = "import/" + p.Name
	}
	tip, err := repo.CreateBranch(ctx, branch, a.base, func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
		return files, fmt.Sprintf("Import VM %s on %s, adopting its disk\n\n%s", p.Name, a.host, p.ReviewText()), nil
	})
	if err != nil {
		if slices.ContainsFunc(staged, func(s adopt.Staged) bool { return s.Method != adopt.MethodAlready }) {
			if uerr := adopt.UnstageAll(staged); uerr != nil {
				return &exitError{code: 1, err: fmt.Errorf("%w; putting the disks back failed too: %v", err, uerr)}
			}
			fmt.Fprintf(out, "put the disks back where they were (those staged before this run stay)\n")
		}
		return &exitError{code: 1, err: err}
	}
	fmt.Fprintf(out, "\nwrote %s on branch %s (%s), from %s: review and merge it.\n", strings.Join(slices.Sorted(maps.Keys(files)), ", "), branch, desired.Hash(tip).Short(), a.base)
	if !a.stage {
		fmt.Fprintf(out, "Before merging, stage the disk on %s: gitfleet import %s --host %s --stage (as root)\n", a.host, sourceFlag(a), a.host)
	}
	return nil
}

func stagedHow(method string) string {
	switch method {
	case adopt.MethodRename:
		return "renamed on one filesystem: no byte copied; the old path is gone, undefine the libvirt domain"
	case adopt.MethodReflink:
		return "a reflink clone; the original is kept: remove it once the VM runs"
	}
	return "copied and checked by sha256; the original is kept: remove it once the VM runs"
}

func sourceFlag(a importArgs) string {
	if a.libvirtXML != "" {
		return "--libvirt-xml " + a.libvirtXML
	}
	return fmt.Sprintf("--disk %s --name %s --cpus %d --memory %d --mac %s", a.disk, a.name, a.cpus, a.memoryMB, a.mac)
}

// validateImport loads the fleet at --base with the VM file added, as
// the controller would load the merged branch, and prints its errors.
func validateImport(ctx context.Context, out io.Writer, repo *gitsource.Repo, a importArgs, files map[string][]byte) error {
	tip, err := repo.Fetch(ctx, a.base)
	if err != nil {
		return &exitError{code: 1, err: fmt.Errorf("--base %s: %w", a.base, err)}
	}
	tree, err := repo.Tree(tip, "")
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	if err := refuseReplacing(out, tree, a.base, files); err != nil {
		return &exitError{code: 1, err: err}
	}
	_, err = desired.NewLoader(a.path).Load(withFiles{tree, files})
	var list desired.ErrorList
	switch {
	case errors.As(err, &list):
		for _, e := range list {
			fmt.Fprintln(out, e)
		}
		return &exitError{code: 1, err: fmt.Errorf("the imported objects on %s do not validate (%s); nothing written", a.base, plural(len(list), "error", "errors"))}
	case err != nil:
		return &exitError{code: 1, err: err}
	}
	return nil
}

// refuseReplacing refuses files when one of their paths is in tree (the
// fleet at base) already: importing would replace that object's file on
// the branch (a VM of the same name, or whatever lives at that path). It
// prints each such path to out.
func refuseReplacing(out io.Writer, tree desired.Tree, base string, files map[string][]byte) error {
	var taken []string
	err := tree.Walk(func(f desired.File) error {
		if _, ok := files[path.Clean(f.Path)]; ok {
			taken = append(taken, f.Path)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(taken) > 0 {
		slices.Sort(taken)
		for _, p := range taken {
			fmt.Fprintf(out, "%s: in the fleet at %s already; importing would replace it\n", p, base)
		}
		return fmt.Errorf("%s is in the fleet at %s already: importing would replace it; --name to choose another name; nothing written", strings.Join(taken, ", "), base)
	}
	return nil
}

// withFiles is a tree with files added (or replaced), path → content.
type withFiles struct {
	desired.Tree
	files map[string][]byte
}

func (w withFiles) Walk(fn func(desired.File) error) error {
	added := make(map[string][]byte, len(w.files))
	for p, data := range w.files {
		added[path.Clean(p)] = data
	}
	if err := w.Tree.Walk(func(f desired.File) error {
		if _, ok := added[path.Clean(f.Path)]; ok {
			return nil
		}
		return fn(f)
	}); err != nil {
		return err
	}
	for _, p := range slices.Sorted(maps.Keys(added)) {
		data := added[p]
		if err := fn(desired.File{Path: p, Mode: desired.Regular, Size: int64(len(data)),
			Read: func() ([]byte, error) { return data, nil }}); err != nil {
			return err
		}
	}
	return nil
}
