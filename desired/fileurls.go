package desired

import (
	"fmt"
	"sort"
	"strings"
)

// FileURLWarnings lists, one line per artifact, the VMs of f whose image,
// kernel or initrd is a file:// URL, as "FILE:LINE:COL: vm NAME:
// spec.image.url is a file:// URL: …", at the URL's own line and column.
// Such a URL names a path on the host: an agent refuses it unless its
// artifacts.fileRoots allow that directory, so a person reviewing a change
// should look twice. Sorted by file, line and column.
func (f *Fleet) FileURLWarnings() []string {
	type warning struct {
		origin Origin
		text   string
	}
	var ws []warning
	for _, vm := range f.VMs {
		arts := []struct{ field, url string }{}
		if vm.Spec.Image != nil {
			arts = append(arts, struct{ field, url string }{"spec.image.url", vm.Spec.Image.URL})
		}
		if k := vm.Spec.Kernel; k != nil {
			arts = append(arts, struct{ field, url string }{"spec.kernel.url", k.URL})
			if k.Initrd != nil {
				arts = append(arts, struct{ field, url string }{"spec.kernel.initrd.url", k.Initrd.URL})
			}
		}
		for _, a := range arts {
			if strings.HasPrefix(strings.ToLower(a.url), "file:") {
				at := vm.FieldOrigin(a.field)
				ws = append(ws, warning{at, fmt.Sprintf("%s:%d:%d: vm %s: %s is a file:// URL (a path on the host): agents refuse it unless their artifacts.fileRoots allow its directory",
					at.File, at.Line, at.Col, vm.Metadata.Name, a.field)})
			}
		}
	}
	sort.Slice(ws, func(i, j int) bool {
		if ws[i].origin.File != ws[j].origin.File {
			return ws[i].origin.File < ws[j].origin.File
		}
		if ws[i].origin.Line != ws[j].origin.Line {
			return ws[i].origin.Line < ws[j].origin.Line
		}
		if ws[i].origin.Col != ws[j].origin.Col {
			return ws[i].origin.Col < ws[j].origin.Col
		}
		return ws[i].text < ws[j].text
	})
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.text
	}
	return out
}
