package config

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every line of docs/DESIGN.md's "Threat model" is pinned by a test it
// names: each name is a test function of the repository, so renaming or
// removing one fails here until the section is made true again.
func TestThreatModelNamesRealTests(t *testing.T) {
	root := filepath.Join("..", "..", "..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "DESIGN.md"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?s)\n## Threat model\n(.*?)\n## `).FindSubmatch(doc)
	require.NotNil(t, m, "docs/DESIGN.md has a Threat model section")
	named := map[string]bool{}
	for _, n := range regexp.MustCompile("`(Test[A-Za-z0-9_]+)`").FindAllStringSubmatch(string(m[1]), -1) {
		named[n[1]] = true
	}
	require.NotEmpty(t, named)
	defined := map[string]bool{}
	funcs := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]+)\(`)
	require.NoError(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return err
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, f := range funcs.FindAllStringSubmatch(string(src), -1) {
			defined[f[1]] = true
		}
		return nil
	}))
	for n := range named {
		if !defined[n] {
			t.Errorf("the Threat model names %s, which is no test of the repository", n)
		}
	}
}
