package debianguest

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/internal/tinyguest"
)

// TestBuild builds the guest (or finds it cached), twice at once, and
// checks what Build returns is what the files hold.
func TestBuild(t *testing.T) {
	if why := Missing(); why != "" {
		t.Skipf("building the Debian guest needs %s", why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	guests := make([]*Guest, 2)
	errs := make([]error, 2)
	for i := range guests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			guests[i], errs[i] = Build(ctx, TestCacheDir())
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	g := guests[0]
	if *guests[1] != *g {
		t.Errorf("concurrent Builds differ: %+v vs %+v", guests[1], g)
	}
	for _, a := range []struct{ path, sum string }{{g.Image, g.ImageSHA256}, {g.Kernel, g.KernelSHA256}, {g.Initrd, g.InitrdSHA256}} {
		have, err := tinyguest.FileSHA256(a.path)
		if err != nil {
			t.Fatal(err)
		}
		if have != a.sum {
			t.Errorf("%s: sha256 %s, Build said %s", a.path, have, a.sum)
		}
	}
	out, err := exec.Command("qemu-img", "info", "--output=json", g.Image).Output()
	if err != nil {
		t.Fatalf("qemu-img info: %v", err)
	}
	var info struct {
		Format          string `json:"format"`
		BackingFilename string `json:"backing-filename"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatal(err)
	}
	if info.Format != "qcow2" || info.BackingFilename != "" {
		t.Errorf("image is %s with backing file %q, want a self-contained qcow2", info.Format, info.BackingFilename)
	}
	// The root filesystem is the whole first virtio disk, as the QEMU
	// backend attaches the root disk first.
	if !strings.Contains(" "+g.Cmdline+" ", " root=/dev/vda ") || !strings.Contains(g.Cmdline, "console=ttyS0") {
		t.Errorf("cmdline %q: want root=/dev/vda and console=ttyS0", g.Cmdline)
	}
}
