package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// fleet40Files reads the fleet of 40 VMs on one profile that package
// desired tests with, as files for a checkout or a commit.
func fleet40Files(t *testing.T) map[string]string {
	t.Helper()
	root := filepath.Join("..", "..", "desired", "testdata", "profiles", "fleet40")
	files := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		rel, _ := filepath.Rel(root, p)
		files[filepath.ToSlash(rel)] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestShow(t *testing.T) {
	files := fleet40Files(t)
	files["vms/web-07.yaml"] += "  memoryMB: 4096\n"
	dir := writeFleet(t, files)
	code, out := runCLI(t, "show", "--repo", dir, "web-07")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	prefix := filepath.ToSlash(filepath.Clean(dir)) + "/"
	for _, want := range []string{
		"VM web-07 (" + prefix + "vms/web-07.yaml), profile web (" + prefix + "profiles/web.yaml)\n",
		"spec.memoryMB                     " + prefix + "vms/web-07.yaml:9:13     4096\n",
		"spec.vcpus                        " + prefix + "profiles/web.yaml:8:10   2\n",
		"spec.cloudInit.userData           " + prefix + "profiles/web.yaml:18:15  (secret)\n",
		"spec.power                        (default)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "nginx") {
		t.Errorf("user-data shown:\n%s", out)
	}

	code, out = runCLI(t, "show", "--repo", dir, "--format", "json", "web-08")
	var ex desired.Explanation
	if code != 0 || json.Unmarshal([]byte(out), &ex) != nil || ex.Profile != "web" || len(ex.Fields) != 10 {
		t.Fatalf("exit %d, explanation %+v\n%s", code, ex, out)
	}

	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string
	}{
		{"no such VM", []string{"--repo", dir, "web-99"}, 1, ""},
		{"bad format", []string{"--repo", dir, "--format", "yaml", "web-01"}, 2, ""},
		{"no name", []string{"--repo", dir}, 2, ""},
		{"not a directory", []string{"--repo", filepath.Join(dir, "nope"), "web-01"}, 2, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, out := runCLI(t, append([]string{"show"}, tc.args...)...); code != tc.code || out != tc.out {
				t.Errorf("exit %d, output %q; want %d, %q", code, out, tc.code, tc.out)
			}
		})
	}
	t.Run("an invalid fleet", func(t *testing.T) {
		files := fleet40Files(t)
		delete(files, "profiles/web.yaml")
		code, out := runCLI(t, "show", "--repo", writeFleet(t, files), "web-01")
		if code != 1 || strings.Count(out, `Profile "web" does not exist`) != 40 {
			t.Errorf("exit %d\n%s", code, out)
		}
	})
}

func TestValidateCountsProfiles(t *testing.T) {
	code, out := runCLI(t, "validate", writeFleet(t, fleet40Files(t)))
	if code != 0 || out != "43 objects: 40 VMs, 0 volumes, 2 hosts, 1 profile\n" {
		t.Fatalf("exit %d, output %q", code, out)
	}
}

// TestPlanOfAProfileChange runs plan over a commit that changes the
// profile of 40 VMs, and one that deletes it while they name it.
func TestPlanOfAProfileChange(t *testing.T) {
	dir := gittest.NewBare(t)
	files := fleet40Files(t)
	base := gittest.Commit(t, dir, gittest.Edit{Write: files})
	profile := files["profiles/web.yaml"]
	head := gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"profiles/web.yaml": strings.Replace(profile, "memoryMB: 2048", "memoryMB: 4096", 1)}})
	code, out := runCLI(t, "plan", "--repo", dir, "--base", base, "--head", head)
	if code != 0 || !strings.Contains(out, "profile web (profiles/web.yaml)\n  ~ update Profile web\n      spec.memoryMB: 2048 -> 4096\n  reaches 40 VMs:\n    restarts the VM (40): web-01, web-02,") ||
		strings.Count(out, "spec.memoryMB: 2048 -> 4096  [restarts the VM]") != 40 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	deleted := gittest.Commit(t, dir, gittest.Edit{Remove: []string{"profiles/web.yaml"}})
	code, out = runCLI(t, "plan", "--repo", dir, "--base", head, "--head", deleted)
	if code != 1 || strings.Count(out, `spec.profile: Profile "web" does not exist`) != 40 {
		t.Fatalf("a used profile deleted: exit %d\n%s", code, out)
	}
}
