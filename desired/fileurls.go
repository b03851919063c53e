package desired

import (
	"fmt"
	"sort"
	"strings"
)

// FileURLWarnings lists, one line per artifact, the VMs of f whose image,
// kernel or initrd is a file:// URL, as "FILE:LINE: vm NAME:
// spec.image.url is a file:// URL: …". Such a URL names a path on the
// host: an agent refuses it unless its artifacts.fileRoots allow that
// directory, so a person reviewing a change should look twice. Sorted by
// file and line.
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
				ws = append(ws, warning{vm.Origin, fmt.Sprintf("%s:%d: vm %s: %s is a file:// URL (a path on the host): agents refuse it unless their artifacts.fileRoots allow its directory",
					vm.Origin.File, vm.Origin.Line, vm.Metadata.Name, a.field)})
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
		return ws[i].text < ws[j].text
	})
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.text
	}
	return out
}
