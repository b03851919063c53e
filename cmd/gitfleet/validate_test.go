package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// runCLI runs the gitfleet command line in-process, on a root command of
// its own, and returns its exit code and standard output.
func runCLI(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var out bytes.Buffer
	root := newRootCmd()
	root.SetOut(&out)
	code := execute(root, args)
	return code, out.String()
}

func writeFleet(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, c := range files {
		full := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const testHost = "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec: {capacity: {vcpus: 2}}\n"

func testVM(name string, vcpus string) string {
	return "apiVersion: gitfleet.dev/v1alpha1\nkind: VM\nmetadata: {name: " + name + "}\nspec:\n  host: hv-a\n  vcpus: " + vcpus +
		"\n  memoryMB: 512\n  diskGB: 5\n  image: {url: https://example.org/i.qcow2, sha256: " + strings.Repeat("ab", 32) + "}\n"
}

func TestValidateExamplesFleet(t *testing.T) {
	code, out := runCLI(t, "validate", filepath.Join("..", "..", "examples", "fleet"))
	if code != 0 || out != "8 objects: 4 VMs, 1 volume, 2 hosts, 1 profile\n" {
		t.Fatalf("exit %d, output %q", code, out)
	}
}

func TestValidate(t *testing.T) {
	good := writeFleet(t, map[string]string{"h.yaml": testHost, "vms/a.yaml": testVM("a", "1")})
	bad := writeFleet(t, map[string]string{
		"h.yaml":     testHost,
		"vms/a.yaml": testVM("a", "2"),
		"vms/b.yaml": testVM("b", `"1"`),
		"vms/c.yaml": testVM("a", "1"),
	})
	tests := []struct {
		name string
		args []string
		code int
		want string // exact output; "{DIR}" stands for the bad fleet
	}{
		{"valid", []string{"validate", good}, 0, "2 objects: 1 VM, 0 volumes, 1 host\n"},
		{"every error with its location", []string{"validate", bad}, 1,
			"{DIR}/vms/b.yaml:6:10: spec.vcpus: must be an integer, got the string \"1\"\n" +
				"{DIR}/vms/c.yaml:3:18: metadata.name: VM \"a\" is also defined in {DIR}/vms/a.yaml:3:18; names are unique per kind\n"},
		{"capacity", []string{"validate", writeFleet(t, map[string]string{"h.yaml": testHost, "a.yaml": testVM("a", "2"), "b.yaml": testVM("b", "1")})}, 1,
			"{TMP}/h.yaml:4:26: spec.capacity.vcpus: the 2 VMs on this host ask for 3 vCPUs in all, more than its capacity of 2: a ({TMP}/a.yaml:3:18) asks 2, b ({TMP}/b.yaml:3:18) asks 1\n"},
		{"too many arguments", []string{"validate", good, bad}, 2, ""},
		{"not a directory", []string{"validate", filepath.Join(good, "h.yaml")}, 2, ""},
		{"missing directory", []string{"validate", filepath.Join(good, "nope")}, 2, ""},
		{"unknown format", []string{"validate", "--format", "xml", good}, 2, ""},
		{"unknown flag", []string{"validate", "--formt", "json", good}, 2, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out := runCLI(t, tt.args...)
			want := strings.ReplaceAll(tt.want, "{DIR}", bad)
			want = strings.ReplaceAll(want, "{TMP}", tt.args[len(tt.args)-1])
			if code != tt.code || out != want {
				t.Errorf("exit %d, output:\n%s\nwant exit %d, output:\n%s", code, out, tt.code, want)
			}
		})
	}
}

// A file:// artifact URL names a path on the host: validate flags it,
// and never echoes a token a URL carries.
func TestValidateFlagsFileURLs(t *testing.T) {
	vm := strings.Replace(testVM("a", "1"), "https://example.org/i.qcow2", "file:///etc/shadow", 1)
	dir := writeFleet(t, map[string]string{"h.yaml": testHost, "vms/a.yaml": vm})
	code, out := runCLI(t, "validate", dir)
	// At the URL itself, FILE:LINE:COL like every other message.
	before := vm[:strings.Index(vm, "file:///etc/shadow")]
	line, col := strings.Count(before, "\n")+1, len(before)-strings.LastIndex(before, "\n")
	want := fmt.Sprintf("warning: %s/vms/a.yaml:%d:%d: vm a: spec.image.url is a file:// URL (a path on the host): agents refuse it unless their artifacts.fileRoots allow its directory\n", dir, line, col)
	if code != 0 || !strings.Contains(out, want) {
		t.Errorf("exit %d, output %q, want it to contain %q", code, out, want)
	}
	bad := strings.Replace(testVM("a", "1"), "https://example.org/i.qcow2", "https://s3cr3t-token@/i.qcow2?private_token=s3cr3t-token", 1)
	code, out = runCLI(t, "validate", writeFleet(t, map[string]string{"h.yaml": testHost, "vms/a.yaml": bad}))
	if code != 1 || strings.Contains(out, "s3cr3t") {
		t.Errorf("exit %d, output %q: want an error that does not echo the token", code, out)
	}
}

func TestValidateDefaultsToCurrentDirectory(t *testing.T) {
	t.Chdir(writeFleet(t, map[string]string{"h.yaml": testHost, "broken.yml": "kind: VM\n"}))
	code, out := runCLI(t, "validate")
	if code != 1 || !strings.HasPrefix(out, "broken.yml:1:1: apiVersion: missing") {
		t.Errorf("exit %d, output %q", code, out)
	}
}

func TestValidateJSON(t *testing.T) {
	good := writeFleet(t, map[string]string{"h.yaml": testHost})
	bad := writeFleet(t, map[string]string{"h.yaml": testHost, "v.yaml": testVM("a", "0")})
	for _, tt := range []struct {
		dir   string
		code  int
		valid bool
		errs  []string
	}{
		{good, 0, true, nil},
		{bad, 1, false, []string{filepath.Join(bad, "v.yaml") + ":6:10: spec.vcpus: 0 is out of range; must be 1 to 256"}},
	} {
		code, out := runCLI(t, "validate", "--format", "json", tt.dir)
		var rep struct {
			Dir     string `json:"dir"`
			Valid   bool   `json:"valid"`
			Objects int    `json:"objects"`
			Hosts   int    `json:"hosts"`
			Errors  []struct {
				File    string `json:"file"`
				Line    int    `json:"line"`
				Col     int    `json:"col"`
				Field   string `json:"field"`
				Message string `json:"message"`
			} `json:"errors"`
		}
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("output is not JSON: %v\n%s", err, out)
		}
		var got []string
		for _, e := range rep.Errors {
			got = append(got, e.File+":"+strconv.Itoa(e.Line)+":"+strconv.Itoa(e.Col)+": "+e.Field+": "+e.Message)
		}
		if code != tt.code || rep.Valid != tt.valid || rep.Dir != tt.dir || strings.Join(got, "\n") != strings.Join(tt.errs, "\n") {
			t.Errorf("exit %d, report %+v; want exit %d, valid %v, errors %q", code, rep, tt.code, tt.valid, tt.errs)
		}
		if tt.valid && (rep.Objects != 1 || rep.Hosts != 1) {
			t.Errorf("counts: %+v", rep)
		}
	}
}

func TestValidateReadFailure(t *testing.T) {
	dir := writeFleet(t, map[string]string{"h.yaml": testHost})
	if err := syscall.Mkfifo(filepath.Join(dir, "pipe.yaml"), 0o644); err != nil {
		t.Skipf("cannot make a FIFO here: %v", err)
	}
	code, out := runCLI(t, "validate", "--format", "json", dir)
	var rep struct {
		Valid     bool   `json:"valid"`
		ReadError string `json:"readError"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if code != 1 || rep.Valid || !strings.Contains(rep.ReadError, "pipe.yaml is not a regular file") {
		t.Errorf("exit %d, report %+v; want exit 1 and the read error", code, rep)
	}
}

// TestValidateRefusesAFleetWithoutObjects pins that validate on a directory
// without objects fails with the very message the controller and plan get
// from the same directory of a git tree: a fleet without objects would
// delete every VM, so no reader takes it for a valid fleet.
func TestValidateRefusesAFleetWithoutObjects(t *testing.T) {
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	commit := gittest.Commit(t, bare, gittest.Edit{Write: map[string]string{
		"README.md": "# fleet\n", ".gitfleet/schema.json": "{}\n", "fleet/.gitfleet/schema.json": "{}\n", "fleet/README.md": "moved\n",
	}})
	ctx := context.Background()
	repo, err := gitsource.Open(ctx, gitsource.Options{URL: bare, CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Fetch(ctx, "main"); err != nil {
		t.Fatal(err)
	}
	tree, err := repo.Tree(commit, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(writeFleet(t, map[string]string{"README.md": "# fleet\n", "fleet/.gitfleet/schema.json": "{}\n", "fleet/README.md": "moved\n"}))
	if err := os.Mkdir("empty", 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ validateDir, loaderDir string }{
		{".", ""},
		{"fleet", "fleet"},
		{"fleet/", "fleet"},
		{"empty", "empty"},
	} {
		_, loadErr := desired.NewLoader(tc.loaderDir).Load(tree)
		if !errors.Is(loadErr, desired.ErrInvalid) || !strings.Contains(loadErr.Error(), "no objects under") {
			t.Fatalf("loader on %q of the git tree: %v; want the fleet refused", tc.loaderDir, loadErr)
		}
		code, out := runCLI(t, "validate", tc.validateDir)
		if code != 1 || out != loadErr.Error()+"\n" {
			t.Errorf("validate %s: exit %d, output:\n%s\nwant exit 1 and the loader's error:\n%s", tc.validateDir, code, out, loadErr)
		}
	}
}
