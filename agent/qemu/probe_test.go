package qemu

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
)

// Every qemu-img the provisioner runs is told the format of the file it
// opens: a probed format is what a file's own bytes claim to be.
func TestQEMUImgIsAlwaysToldTheFormat(t *testing.T) {
	real := needQEMUImg(t)
	dir := t.TempDir()
	logPath := filepath.Join(dir, "calls")
	wrapper := filepath.Join(dir, "qemu-img")
	script := "#!/bin/sh\necho \"$*\" >> '" + logPath + "'\nexec '" + real + "' \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	srv := newArtifactServer(t)
	raw := make([]byte, 1<<20)
	art := srv.add("/base.raw", raw)
	p, err := New(Config{CacheDir: t.TempDir(), QEMUImg: wrapper, Artifacts: loopbackPolicy(), Accel: AccelTCG, Logger: quietLog().Logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m := agent.Machine{Name: "vm", Dir: t.TempDir(), Spec: desired.VMSpec{DiskGB: 1, Image: &art}, InstanceID: "i-1"}
	if err := p.PrepareRootDisk(ctx, m); err != nil {
		t.Fatal(err)
	}
	m.Spec.DiskGB = 2 // grown offline: qemu-img resize
	if err := p.PrepareRootDisk(ctx, m); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	var resized bool
	for _, call := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		args := strings.Fields(call)
		resized = resized || args[0] == "resize"
		if !strings.Contains(" "+call+" ", " -f ") {
			t.Errorf("qemu-img %s: no -f, so qemu-img probes the format", call)
		}
	}
	if !resized {
		t.Errorf("no qemu-img resize among %q", b)
	}
}
