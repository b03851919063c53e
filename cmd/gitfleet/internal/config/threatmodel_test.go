package config

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every line of docs/DESIGN.md's "Threat model", "A branch writer", is
// pinned by a test it names, as "`package` TestName, TestOther": each
// name is a test function of that package, so renaming, moving or
// removing one fails here until the section is made true again.
func TestThreatModelNamesRealTests(t *testing.T) {
	root := filepath.Join("..", "..", "..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "DESIGN.md"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?s)\n## Threat model\n.*?\n### A branch writer\n(.*?)\n##`).FindSubmatch(doc)
	require.NotNil(t, m, "docs/DESIGN.md's Threat model has a subsection A branch writer")
	defined := map[string]map[string]bool{} // package directory → its test functions
	funcs := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]+)\(`)
	testsOf := func(pkg string) map[string]bool {
		if d, ok := defined[pkg]; ok {
			return d
		}
		d := map[string]bool{}
		files, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(pkg), "*_test.go"))
		require.NoError(t, err)
		for _, f := range files {
			src, err := os.ReadFile(f)
			require.NoError(t, err)
			for _, fn := range funcs.FindAllStringSubmatch(string(src), -1) {
				d[fn[1]] = true
			}
		}
		defined[pkg] = d
		return d
	}
	pkg, named := "", 0
	for _, tok := range regexp.MustCompile("`([a-z][a-z0-9/]*)` |\\b(Test[A-Za-z0-9_]+)\\b").FindAllStringSubmatch(string(m[1]), -1) {
		if tok[1] != "" {
			pkg = tok[1]
			continue
		}
		named++
		if pkg == "" {
			t.Errorf("%s is named before any package", tok[2])
		} else if !testsOf(pkg)[tok[2]] {
			t.Errorf("the Threat model names %s in %s, which has no such test", tok[2], pkg)
		}
	}
	require.NotZero(t, named, "the subsection names no test")
}
