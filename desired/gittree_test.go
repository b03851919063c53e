package desired_test

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// TestLoadGitTreeMatchesDirectory loads the example fleet from a commit of
// a real git repository, without a checkout, and from the directory on
// disk: the same code gives the same fleet. A symlink committed into the
// fleet is rejected.
func TestLoadGitTreeMatchesDirectory(t *testing.T) {
	gittest.NeedGit(t)
	exampleDir := filepath.Join("..", "examples", "fleet")
	files := map[string]string{"README.md": "# fleet repository\n"}
	err := filepath.WalkDir(exampleDir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(exampleDir, p)
		files["fleet/"+filepath.ToSlash(rel)] = string(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	bare := gittest.NewBare(t)
	c1 := gittest.Commit(t, bare, gittest.Edit{Write: files, Message: "add the fleet"})

	ctx := context.Background()
	repo, err := gitsource.Open(ctx, gitsource.Options{URL: bare, CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Fetch(ctx, "main"); err != nil {
		t.Fatal(err)
	}
	tree, err := repo.Tree(c1, "fleet")
	if err != nil {
		t.Fatal(err)
	}
	l := desired.NewLoader("")
	fromGit, err := l.Load(tree)
	if err != nil {
		t.Fatalf("load from git: %v", err)
	}
	fromDir, err := desired.LoadDir(exampleDir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fromGit, fromDir) {
		t.Errorf("the fleet from git differs from the fleet on disk")
	}

	c2 := gittest.Commit(t, bare, gittest.Edit{
		Write:   map[string]string{"fleet/vms/web-03.yaml": "web-01.yaml"},
		Symlink: []string{"fleet/vms/web-03.yaml"},
		Message: "link a VM",
	})
	if _, err := repo.Fetch(ctx, "main"); err != nil {
		t.Fatal(err)
	}
	tree, err = repo.Tree(c2, "fleet")
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Load(tree)
	if err == nil || !strings.HasPrefix(err.Error(), "vms/web-03.yaml:1:1: symlinks are not followed") {
		t.Errorf("err = %v; want the symlink rejected", err)
	}
}
