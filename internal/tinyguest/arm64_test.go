package tinyguest

import (
	"context"
	"debug/elf"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The arm64 guest is Debian's arm64 kernel with an initramfs around
// busybox-static:arm64, whose binary is an AArch64 ELF.
func TestBuildARM64(t *testing.T) {
	if os.Getenv("GITFLEET_SKIP_ARM64") != "" {
		t.Skip("GITFLEET_SKIP_ARM64 is set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	g, err := BuildARM64(ctx, TestCacheDir())
	if err != nil {
		t.Fatal(err)
	}
	if g.Cmdline != CmdlineARM64 || len(g.Modules) == 0 {
		t.Errorf("guest %+v", g)
	}
	f, err := elf.Open(filepath.Join(TestCacheDir(), "busybox-arm64", "bin", "busybox"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Machine != elf.EM_AARCH64 {
		t.Errorf("busybox is for %s, want AArch64", f.Machine)
	}
}
