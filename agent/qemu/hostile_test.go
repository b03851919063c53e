package qemu

import (
	"context"
	"encoding/json"
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

// Hostile sshAuthorizedKeys strings read back through cloud-init's loader
// as exactly what was written, with nothing injected beside them.
func TestSeedHostileKeysReadBack(t *testing.T) {
	keys := []string{
		"ssh-ed25519 AAAA a@b\ninstance-id: evil", "k: v # c", "'single' \"double\"", "line\u2028sep",
		"nel\u0085x", "tab\there", "bom\ufeffx", "\x7fdel", "emoji \U0001F600", "-  dash", "? q", "*alias", "&anchor",
		"%percent", "@at", "`tick", "!tag x", "{a: 1}", "[1]", "\\back", "trailing ", " leading", "cr\rx", "\x1b[31m",
		"surrogate-ish \uFFFE", "nbsp\u00a0x", "vt\vx", "ff\fx",
	}
	files, err := seedFiles("web-01", "web-01-0123", macFor("web-01"), &desired.CloudInit{SSHAuthorizedKeys: keys}, nil)
	if err != nil {
		t.Fatal(err)
	}
	md := cloudInitLoad(t, files["meta-data"])[0]
	if md["instance-id"] != "web-01-0123" {
		t.Errorf("instance-id reads back as %v", md["instance-id"])
	}
	got, _ := json.Marshal(md["public-keys"])
	want, _ := json.Marshal(keys)
	if string(got) != string(want) {
		t.Errorf("public-keys read back as\n%s\nwant\n%s\nmeta-data:\n%s", got, want, files["meta-data"])
	}
}
