package gitsource

import (
	"bufio"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// localBranches reads the branches under prefix ("" for all; else ending
// in "/", or one exact branch name with exact set) of the repository at
// dir straight from its files, without running git: the loose refs under
// refs/heads, else their lines in packed-refs. It answers what a ref
// advertisement of git upload-pack would, at the cost of a few file reads
// instead of a process; ok is false when the files hold none of them (no
// such branch, or refs that are not files: a reftable repository), and
// the caller asks git.
func localBranches(dir, prefix string, exact bool) (branches map[string]string, ok bool) {
	gitDir := dir
	if st, err := os.Stat(filepath.Join(dir, ".git")); err == nil && st.IsDir() {
		gitDir = filepath.Join(dir, ".git")
	}
	out := map[string]string{}
	want := func(b string) bool {
		if exact {
			return b == prefix
		}
		return strings.HasPrefix(b, prefix)
	}
	if data, err := os.ReadFile(filepath.Join(gitDir, "packed-refs")); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			hash, name, found := strings.Cut(sc.Text(), " ")
			b, isHead := strings.CutPrefix(name, "refs/heads/")
			if found && isHead && isHash(hash) && want(b) {
				out[b] = hash
			}
		}
	}
	heads := filepath.Join(gitDir, "refs", "heads")
	readLoose := func(p string) {
		b := filepath.ToSlash(strings.TrimPrefix(p, heads+string(filepath.Separator)))
		if strings.HasSuffix(b, ".lock") || !want(b) {
			return // a ref being written: its new value is the next event
		}
		data, err := os.ReadFile(p)
		if hash := strings.TrimSpace(string(data)); err == nil && isHash(hash) {
			out[b] = hash
		}
	}
	if exact {
		readLoose(filepath.Join(heads, filepath.FromSlash(prefix)))
	} else {
		root := filepath.Join(heads, filepath.FromSlash(strings.TrimSuffix(prefix, "/")))
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if !d.IsDir() {
				readLoose(p)
			}
			return nil
		})
	}
	return out, len(out) > 0
}

// isHash reports whether s is a full hex SHA-1.
func isHash(s string) bool {
	if len(s) != 40 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// filesRefs reports whether the repository at dir keeps its refs in files
// (refs/heads a directory, no reftable): then localBranches finding no
// branch is the answer, as certain as git's (a ref being written is the
// next change's), and git need not be asked.
func filesRefs(dir string) bool {
	gitDir := dir
	if st, err := os.Stat(filepath.Join(dir, ".git")); err == nil && st.IsDir() {
		gitDir = filepath.Join(dir, ".git")
	}
	if _, err := os.Stat(filepath.Join(gitDir, "reftable")); !errors.Is(err, fs.ErrNotExist) {
		return false
	}
	st, err := os.Stat(filepath.Join(gitDir, "refs", "heads"))
	return err == nil && st.IsDir()
}
