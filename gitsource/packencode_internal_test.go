package gitsource

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/storage/memory"

	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// A pack encodePack writes is one git itself indexes, holding every
// object with its contents: sizes on each side of the header's 4- and
// 7-bit boundaries, and an empty blob.
func TestEncodePackIsReadByGit(t *testing.T) {
	gittest.NeedGit(t)
	st := memory.NewStorage()
	want := map[plumbing.Hash]string{}
	var hs []plumbing.Hash
	for _, n := range []int{0, 1, 15, 16, 127, 2047, 2048, 300_000} {
		data := strings.Repeat("ledger line\n", n/12+1)[:n]
		obj := st.NewEncodedObject()
		obj.SetType(plumbing.BlobObject)
		w, err := obj.Writer()
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(data))
		w.Close()
		h, err := st.SetEncodedObject(obj)
		if err != nil {
			t.Fatal(err)
		}
		want[h] = data
		hs = append(hs, h)
	}
	var pack bytes.Buffer
	if _, err := encodePack(&pack, st, hs); err != nil {
		t.Fatal(err)
	}
	dir := gittest.NewBare(t)
	cmd := exec.Command("git", "index-pack", "--stdin")
	cmd.Dir = dir
	cmd.Stdin = &pack
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git index-pack: %v\n%s", err, out)
	}
	for h, data := range want {
		cmd := exec.Command("git", "cat-file", "blob", h.String())
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git cat-file %s: %v", h, err)
		}
		if string(out) != data {
			t.Errorf("blob %s: %d bytes back, want %d", h, len(out), len(data))
		}
	}
}
