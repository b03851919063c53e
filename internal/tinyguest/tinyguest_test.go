package tinyguest

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

type readEntry struct {
	mode       uint32
	rmaj, rmin uint32
	data       []byte
	index      int
}

// readNewc parses a newc archive independently of the writer.
func readNewc(t *testing.T, r io.Reader) map[string]readEntry {
	t.Helper()
	all, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]readEntry{}
	off := 0
	field := func(i int) uint32 {
		v, err := strconv.ParseUint(string(all[off+6+8*i:off+14+8*i]), 16, 32)
		if err != nil {
			t.Fatalf("field %d at %d: %v", i, off, err)
		}
		return uint32(v)
	}
	align := func(n int) int { return (n + 3) &^ 3 }
	for i := 0; ; i++ {
		if string(all[off:off+6]) != "070701" {
			t.Fatalf("bad magic at %d: %q", off, all[off:off+6])
		}
		mode, size, rmaj, rmin, namesize := field(1), field(6), field(9), field(10), field(11)
		name := string(all[off+110 : off+110+int(namesize)-1])
		dataOff := align(off + 110 + int(namesize))
		data := all[dataOff : dataOff+int(size)]
		off = align(dataOff + int(size))
		if name == "TRAILER!!!" {
			return out
		}
		out[name] = readEntry{mode: mode, rmaj: rmaj, rmin: rmin, data: data, index: i}
	}
}

func TestCpioWriterRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	cw := &cpioWriter{w: &buf}
	entries := []cpioEntry{
		{Name: "dev", Mode: cpioTypeDir | 0o755},
		{Name: "dev/console", Mode: cpioTypeChar | 0o600, RdevMajor: 5, RdevMinor: 1},
		{Name: "a", Mode: cpioTypeFile | 0o644, Data: []byte("x")},
		{Name: "bb", Mode: cpioTypeFile | 0o755, Data: []byte("hello, world")},
		{Name: "l", Mode: cpioTypeSymlink | 0o777, Data: []byte("bb")},
	}
	for _, e := range entries {
		if err := cw.add(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := cw.close(); err != nil {
		t.Fatal(err)
	}
	if buf.Len()%4 != 0 {
		t.Errorf("archive length %d is not 4-aligned", buf.Len())
	}
	got := readNewc(t, bytes.NewReader(buf.Bytes()))
	for _, e := range entries {
		g, ok := got[e.Name]
		if !ok {
			t.Fatalf("%s missing", e.Name)
		}
		if g.mode != e.Mode || g.rmaj != e.RdevMajor || g.rmin != e.RdevMinor || !bytes.Equal(g.data, e.Data) {
			t.Errorf("%s: got mode %o rdev %d:%d data %q", e.Name, g.mode, g.rmaj, g.rmin, g.data)
		}
	}
	// The system cpio, when present, must agree on the listing.
	if _, err := exec.LookPath("cpio"); err == nil {
		cmd := exec.Command("cpio", "-t", "--quiet")
		cmd.Stdin = bytes.NewReader(buf.Bytes())
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("cpio -t: %v", err)
		}
		if want := "dev\ndev/console\na\nbb\nl\n"; string(out) != want {
			t.Errorf("cpio -t listed %q, want %q", out, want)
		}
	}
}

func TestBuild(t *testing.T) {
	if _, err := os.Stat(BusyboxPath); err != nil {
		t.Skipf("busybox-static not installed (%s): %v", BusyboxPath, err)
	}
	dir := TestCacheDir()
	g, err := Build(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []struct{ path, sum string }{{g.Kernel, g.KernelSHA256}, {g.Initrd, g.InitrdSHA256}} {
		have, err := FileSHA256(a.path)
		if err != nil {
			t.Fatal(err)
		}
		if have != a.sum {
			t.Errorf("%s: sha256 %s, Build said %s", a.path, have, a.sum)
		}
	}

	f, err := os.Open(g.Initrd)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("initrd is not gzip: %v", err)
	}
	files := readNewc(t, zr)
	if c := files["dev/console"]; c.mode != cpioTypeChar|0o600 || c.rmaj != 5 || c.rmin != 1 {
		t.Errorf("dev/console: mode %o rdev %d:%d, want char 5:1", c.mode, c.rmaj, c.rmin)
	}
	if !bytes.Equal(files["init"].data, initScript) || files["init"].mode&0o111 == 0 {
		t.Errorf("init missing or not executable")
	}
	// Every wanted module that is not built in is loaded, after its
	// dependencies.
	// The modules come from the kernel Build found: the cache's unpacked
	// package, or the host's own (as on a machine with a kernel in /boot).
	root, rel, err := findKernel(context.Background(), dir)
	if err != nil || rel != g.KernelRelease {
		t.Fatalf("findKernel = %s %s, %v; Build used release %s", root, rel, err, g.KernelRelease)
	}
	ms, err := loadModuleSet(filepath.Join(root, "lib", "modules", rel))
	if err != nil {
		t.Fatal(err)
	}
	order := strings.Fields(string(files["etc/modules"].data))
	pos := map[string]int{}
	for i, m := range order {
		pos[m] = i
		if _, ok := files["lib/modules/"+m+".ko"]; !ok {
			t.Errorf("module %s listed but not packed", m)
		}
	}
	for _, w := range wantModules {
		if _, ok := pos[w]; !ok && !ms.builtin[w] {
			t.Errorf("module %s neither loaded nor built in", w)
		}
	}
	for _, m := range order {
		deps, err := depends(ms.paths[m])
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range deps {
			if p, ok := pos[d]; ok && p > pos[m] {
				t.Errorf("%s loads before its dependency %s", m, d)
			} else if !ok && !ms.builtin[d] {
				t.Errorf("%s depends on %s, which is missing", m, d)
			}
		}
	}
	if fmt.Sprint(order) == "[]" {
		t.Error("no modules at all: the Debian kernel has virtio as modules")
	}

	again, err := Build(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if again.Initrd != g.Initrd || again.InitrdSHA256 != g.InitrdSHA256 || again.Kernel != g.Kernel {
		t.Errorf("second Build differs: %+v vs %+v", again, g)
	}
}
