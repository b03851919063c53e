package main

import (
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

func TestBuildVersion(t *testing.T) {
	vcs := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"}, {Key: "vcs.modified", Value: "true"}}}
	for _, tc := range []struct {
		name            string
		version, commit string
		bi              *debug.BuildInfo
		wantV, wantC    string
	}{
		{"make build stamps both", "v1.2.3", "abc123", vcs, "v1.2.3", "abc123"},
		{"a checkout's build", "dev", "", vcs, "dev", "0123456789abcdef0123456789abcdef01234567-dirty"},
		{"go install @version", "dev", "", &debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}}, "v1.4.0", "unknown"},
		{"nothing recorded", "dev", "", nil, "dev", "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, c := buildVersion(tc.version, tc.commit, tc.bi)
			if v != tc.wantV || c != tc.wantC {
				t.Errorf("buildVersion = %q, %q; want %q, %q", v, c, tc.wantV, tc.wantC)
			}
		})
	}
}

// The Makefile's -ldflags reach gitfleet version.
func TestVersionFromLdflags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "gitfleet")
	build := exec.Command("go", "build", "-ldflags", "-X main.version=v9.8.7 -X main.commit=feedface", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != "gitfleet v9.8.7 (commit feedface)" {
		t.Errorf("gitfleet version = %q", got)
	}
}
