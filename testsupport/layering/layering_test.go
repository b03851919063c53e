// Package layering holds the one test of the tree's shape: which package may
// import which. It reads the non-test imports of every package with
// `go list -json ./...` and checks them against the layers below, so an import
// that runs from a lower layer into a higher one, production code that links
// test support, or a new package nobody placed fails the suite.
package layering

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/gitfleet/gitfleet/"

// rank places each package of the module in a layer: a package may import
// only packages of a lower rank (imports inside one package family, such as
// agent/qemu of agent, follow the same rule). The leaf helpers under
// internal/ are rank 0: any package may use them, and they use nothing of
// the module but each other. Test support (testsupport/...) is not ranked: no
// production package may import it, and it may import any production package
// but the binary's own.
var rank = map[string]int{
	"internal/errchain":   0,
	"internal/hostfile":   0,
	"internal/httpserve":  0,
	"internal/parallel":   0,
	"internal/redact":     0,
	"internal/safetext":   0,
	"internal/scratchdir": 0,
	"internal/secretfile": 0,
	"internal/sealed":     0,
	"internal/syncbuf":    0,
	"internal/tinyguest":  0,

	"desired":       1,
	"gitsource":     2,
	"agent/hostnet": 2,
	"agent/backup":  0, // desired checks repository URLs with it
	"trust":         3,
	"snapshots":     3,
	"status":        3,
	"fleet":         4,
	"agent":         4,
	"agent/inmem":   5,
	"agent/qemu":    5,
	"adopt":         5,

	"cmd/gitfleet/internal/config": 6,
	"cmd/gitfleet/internal/demo":   7,
	"cmd/gitfleet":                 8,

	"e2e":         9,
	"e2e/systemd": 9,
}

type pkg struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
	Deps       []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(goBin, "list", "-json", module+"...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		// Reading each package's directory and source files tells go test's
		// cache that the result depends on them: an edited import or a new
		// file reruns the test.
		if _, err := os.ReadDir(p.Dir); err != nil {
			t.Fatalf("read %s: %v", p.Dir, err)
		}
		for _, f := range p.GoFiles {
			if _, err := os.Stat(filepath.Join(p.Dir, f)); err != nil {
				t.Fatalf("stat %s: %v", f, err)
			}
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < len(rank) {
		t.Fatalf("go list named %d packages, fewer than the %d this test places", len(pkgs), len(rank))
	}
	return pkgs
}

func local(path string) (string, bool) {
	return strings.CutPrefix(path, module)
}

func isTestSupport(rel string) bool {
	return rel == "testsupport" || strings.HasPrefix(rel, "testsupport/")
}

func TestImportsRunDownTheLayers(t *testing.T) {
	for _, p := range listPackages(t) {
		rel, _ := local(p.ImportPath)
		if isTestSupport(rel) {
			for _, imp := range p.Imports {
				if dep, ok := local(imp); ok && strings.HasPrefix(dep, "cmd/") {
					t.Errorf("test support %s imports the binary's %s", rel, dep)
				}
			}
			continue
		}
		r, placed := rank[rel]
		if !placed {
			t.Errorf("package %s has no layer: place it in this test's rank table", rel)
			continue
		}
		for _, imp := range p.Imports {
			dep, ok := local(imp)
			if !ok {
				continue
			}
			if isTestSupport(dep) {
				t.Errorf("production package %s imports test support %s", rel, dep)
				continue
			}
			if dr, ok := rank[dep]; ok && dr >= r && !(r == 0 && dr == 0) {
				t.Errorf("%s (layer %d) imports %s (layer %d): imports run only to lower layers", rel, r, dep, dr)
			}
		}
	}
}

// The libraries that hold gitfleet's behaviour and the binary link no wiring
// and no test support, however deep the import.
func TestNoLibraryOrBinaryLinksWiringOrTestSupport(t *testing.T) {
	libraries := []string{"agent", "fleet", "status", "snapshots", "desired", "gitsource", "trust"}
	checked := 0
	for _, p := range listPackages(t) {
		rel, _ := local(p.ImportPath)
		lib := false
		for _, l := range libraries {
			if rel == l || strings.HasPrefix(rel, l+"/") {
				lib = true
			}
		}
		if !lib && rel != "cmd/gitfleet" {
			continue
		}
		checked++
		var bad []string
		for _, d := range p.Deps {
			dep, ok := local(d)
			if !ok {
				continue
			}
			if isTestSupport(dep) || (lib && strings.HasPrefix(dep, "cmd/")) {
				bad = append(bad, dep)
			}
		}
		sort.Strings(bad)
		if len(bad) > 0 {
			t.Errorf("%s links %s", rel, strings.Join(bad, ", "))
		}
	}
	if checked < len(libraries)+1 {
		t.Fatalf("checked %d packages, want at least %d", checked, len(libraries)+1)
	}
}
