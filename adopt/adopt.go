// Package adopt brings a VM that already runs outside gitfleet (a libvirt
// domain, a plain QEMU script) into a fleet without rebuilding it: it maps
// what gitfleet can express of the VM into a VM object whose root disk is
// adopted (spec.rootDisk.adopt) and whose NIC keeps its MAC, says field
// by field what it cannot express, and stages the disk where the host's
// agent takes it from.
//
// Use, as gitfleet import does:
//
//	plan, err := adopt.FromLibvirt("web-01.xml", xmlBytes, adopt.Options{Host: "hv-a"})
//	// or adopt.FromDisk(adopt.DiskVM{...})
//	err = adopt.Inspect(ctx, plan, "qemu-img") // refuses a running original; reads the disk's size and format
//	staged, err := adopt.Stage(plan.Disk, stateDir, plan.Name) // on the host: rename (or reflink/copy) into <state>/adopt/<vm>/
//	yaml := plan.Render()                                       // the VM file for review
//
// Nothing here writes to the original disk: Inspect reads it with
// qemu-img info --force-share (which takes no lock) and probes its locks
// with F_OFD_GETLK (which takes none); Stage renames it, or clones or
// copies it into a new file and leaves it where it was. No path of the
// host reaches the VM object: the agent finds the disk by the VM's name.
package adopt

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gitfleet/gitfleet/desired"
)

// Plan is what an import makes of one VM: its name, the spec of its VM
// object, the host path of the disk it adopts as its root disk, and the
// report of every source field, mapped or not.
type Plan struct {
	Name string
	Spec desired.VMSpec
	// Disk is the absolute path of the root disk on the host.
	Disk string
	// Volumes are the VM's other disks, adopted as Volumes (raw files).
	Volumes []VolumePlan
	// Running is set when the source says the VM runs (a libvirt domain
	// with an id); Inspect refuses it.
	Running string
	Report  []Line
}

// VolumePlan is one more disk of the VM, adopted as a Volume: its name,
// the absolute path of its raw file on the host, and its size in GiB
// (Inspect sets it; a volume present on the host is never resized, so
// the size only describes it).
type VolumePlan struct {
	Name   string
	Disk   string
	SizeGB int
}

// Verdict says what became of one source field.
type Verdict string

// The verdicts of a Line.
const (
	// Mapped: the field is in the VM object (Field names it).
	Mapped Verdict = "mapped"
	// Ignored: gitfleet does not write it, and the guest gets it anyway,
	// as QEMU's default (ACPI, a PS/2 keyboard, an RTC in UTC).
	Ignored Verdict = "ignored"
	// Dropped: gitfleet cannot express it, and the guest runs without it
	// (a display, a USB tablet, a sound card): the guest loses that
	// device, not its data or its boot.
	Dropped Verdict = "not expressible"
	// Blocks: gitfleet cannot express it, and the guest may not boot or
	// may lose data without it (a kernel from a host path, a passthrough device, a
	// disk whose data would not come along). Import stops unless told
	// to accept the loss.
	Blocks Verdict = "not expressible, blocks"
	// MappedLoss: the field is in the VM object, but what the source kept
	// in it does not come along (a TPM's state: secrets sealed to it are
	// lost). It blocks as Blocks does.
	MappedLoss Verdict = "mapped with loss, blocks"
)

// Line is one field of the source and what became of it: Source names it
// as the source writes it (domain/devices/graphics[0] type=spice), Field
// is the VM object's field it maps to ("" when none), Note says why or
// how. Path is the host path the field names, if any: shown to the
// person importing, never written into the VM object.
type Line struct {
	Source  string
	Verdict Verdict
	Field   string
	Note    string
	Path    string
}

// String is the line as the report prints it, its host path included.
func (l Line) String() string {
	if l.Path != "" {
		l.Source += " " + l.Path
	}
	return l.text()
}

// text is the line without its host path.
func (l Line) text() string {
	s := fmt.Sprintf("%-22s %s", l.Verdict, l.Source)
	if l.Field != "" {
		s += " → " + l.Field
	}
	if l.Note != "" {
		s += ": " + l.Note
	}
	return s
}

// Blocking lists the lines whose verdict is Blocks or MappedLoss.
func (p *Plan) Blocking() []Line {
	var out []Line
	for _, l := range p.Report {
		if l.Verdict == Blocks || l.Verdict == MappedLoss {
			out = append(out, l)
		}
	}
	return out
}

func (p *Plan) add(verdict Verdict, source, field, note string, args ...any) {
	p.Report = append(p.Report, Line{Source: source, Verdict: verdict, Field: field, Note: fmt.Sprintf(note, args...)})
}

// addPath is add for a field that names path on the host.
func (p *Plan) addPath(verdict Verdict, source, path, field, note string, args ...any) {
	p.add(verdict, source, field, note, args...)
	p.Report[len(p.Report)-1].Path = path
}

// sortReport orders the report by the line and column its Sources
// name (FILE:LINE:COL first), keeping the order of equal places; lines
// that name no place keep their order after the others.
func (p *Plan) sortReport() {
	slices.SortStableFunc(p.Report, func(a, b Line) int {
		la, ca, oka := place(a.Source)
		lb, cb, okb := place(b.Source)
		switch {
		case oka != okb:
			if oka {
				return -1
			}
			return 1
		case la != lb:
			return la - lb
		}
		return ca - cb
	})
}

// place is the LINE and COL of a Source that starts with FILE:LINE:COL.
func place(source string) (line, col int, ok bool) {
	first, _, _ := strings.Cut(source, " ")
	parts := strings.Split(first, ":")
	if len(parts) < 3 {
		return 0, 0, false
	}
	line, err1 := strconv.Atoi(parts[len(parts)-2])
	col, err2 := strconv.Atoi(parts[len(parts)-1])
	return line, col, err1 == nil && err2 == nil
}

// ReportText is the report, one line per source field, in source order,
// with the host paths the fields name: for the person importing.
func (p *Plan) ReportText() string {
	var b strings.Builder
	for _, l := range p.Report {
		b.WriteString(l.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// ReviewText is ReportText without host paths: for what goes into the
// fleet repository (the VM file's comment, the commit message).
func (p *Plan) ReviewText() string {
	var b strings.Builder
	for _, l := range p.Report {
		b.WriteString(l.text())
		b.WriteByte('\n')
	}
	return b.String()
}
