package gitsource_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// setFile is a Mutation writing one file.
func setFile(path, content string) gitsource.Mutation {
	return func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
		return map[string][]byte{path: []byte(content)}, "write " + path, nil
	}
}

// appendLine is a Mutation that appends a line to a file (read-modify-write):
// a lost update would lose a line.
func appendLine(path, line string) gitsource.Mutation {
	return func(_ string, read func(string) ([]byte, error)) (map[string][]byte, string, error) {
		old, err := read(path)
		if err != nil && !errors.Is(err, gitsource.ErrFileNotFound) {
			return nil, "", err
		}
		return map[string][]byte{path: append(old, line+"\n"...)}, "append to " + path, nil
	}
}

// TestUpdateConcurrentWriters: two Repo instances on one remote, each with
// two goroutines, write many times at once; nothing is lost.
func TestUpdateConcurrentWriters(t *testing.T) {
	ctx := context.Background()
	const rounds = 8
	eachTransport(t, func(t *testing.T, rm remote) {
		repos := []*gitsource.Repo{
			open(t, gitsource.Options{URL: rm.url, CacheDir: t.TempDir(), UpdateAttempts: 100}),
			open(t, gitsource.Options{URL: rm.url, UpdateAttempts: 100}),
		}
		var wg sync.WaitGroup
		errs := make(chan error, 4*rounds)
		for i, r := range repos {
			for g := 0; g < 2; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := 0; n < rounds; n++ {
						// Each writer has its own file, and all append to a
						// shared one.
						own := fmt.Sprintf("hosts/w%d-%d.yaml", i, g)
						if _, err := r.Update(ctx, "gitfleet/status", setFile(own, fmt.Sprintf("n: %d\n", n))); err != nil {
							errs <- err
							return
						}
						if _, err := r.Update(ctx, "gitfleet/status", appendLine("log", fmt.Sprintf("w%d-%d %d", i, g, n))); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		tip := gittest.Rev(t, rm.dir, "gitfleet/status")
		for i := range repos {
			for g := 0; g < 2; g++ {
				assert.Equal(t, fmt.Sprintf("n: %d", rounds-1), gittest.Show(t, rm.dir, tip, fmt.Sprintf("hosts/w%d-%d.yaml", i, g)))
			}
		}
		lines := strings.Split(gittest.Show(t, rm.dir, tip, "log"), "\n")
		assert.Len(t, lines, 4*rounds, "every append survived")
		// Linear history: one commit per write, none forced over another.
		assert.Equal(t, fmt.Sprint(8*rounds), gittest.Git(t, rm.dir, "rev-list", "--count", "--first-parent", tip))
		gittest.Git(t, rm.dir, "fsck", "--strict", "--no-dangling")
	})
}

// TestUpdateAfterForcePush: the remote branch was force-pushed back to an
// older commit; Update builds on what the remote holds now.
func TestUpdateAfterForcePush(t *testing.T) {
	ctx := context.Background()
	eachTransport(t, func(t *testing.T, rm remote) {
		old := gittest.Commit(t, rm.dir, gittest.Edit{Write: map[string]string{"a.yaml": "a\n"}})
		r := open(t, gitsource.Options{URL: rm.url, CacheDir: t.TempDir()})
		newer, err := r.Update(ctx, "main", setFile("b.yaml", "b\n"))
		require.NoError(t, err)
		tip, err := r.Fetch(ctx, "main")
		require.NoError(t, err)
		require.Equal(t, newer, tip)

		gittest.SetBranch(t, rm.dir, "main", old)
		tip, err = r.Fetch(ctx, "main")
		require.NoError(t, err)
		assert.Equal(t, old, tip, "a force-push to an older commit is followed")
		ok, err := r.IsAncestor(newer, tip)
		require.NoError(t, err)
		assert.False(t, ok)

		// Another person rewrites history again behind the Repo's back.
		other := gittest.Commit(t, rm.dir, gittest.Edit{Write: map[string]string{"c.yaml": "c\n"}})
		got, err := r.Update(ctx, "main", setFile("d.yaml", "d\n"))
		require.NoError(t, err)
		assert.Equal(t, []string{other}, mustInfo(t, r, got).Parents)
		assert.Equal(t, []string{"a.yaml", "c.yaml", "d.yaml"}, gittest.Files(t, rm.dir, "main"))
	})
}

func TestUpdateRejectsBadPaths(t *testing.T) {
	ctx := context.Background()
	rm := remote{dir: gittest.NewBare(t)}
	rm.url = rm.dir
	gittest.Commit(t, rm.dir, gittest.Edit{Write: map[string]string{"hosts/a.yaml": "a\n", "file": "f\n"}})
	r := open(t, gitsource.Options{URL: rm.url})
	for _, tc := range []struct {
		name  string
		files map[string][]byte
	}{
		{"absolute", map[string][]byte{"/etc/x": []byte("x")}},
		{"dot-dot", map[string][]byte{"hosts/../x": []byte("x")}},
		{"git dir", map[string][]byte{".git/config": []byte("x")}},
		{"trailing slash", map[string][]byte{"hosts/": []byte("x")}},
		{"file and directory at once", map[string][]byte{"n": []byte("x"), "n/m": []byte("y")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.Update(ctx, "main", func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
				return tc.files, "bad", nil
			})
			assert.Error(t, err)
		})
	}
	assert.Equal(t, []string{"file", "hosts/a.yaml"}, gittest.Files(t, rm.dir, "main"))
}

// TestUpdateMutationError: an error of the mutation is returned as it is and
// nothing is written.
func TestUpdateMutationError(t *testing.T) {
	rm := gittest.NewBare(t)
	before := gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"a": "1"}})
	r := open(t, gitsource.Options{URL: rm})
	boom := fmt.Errorf("boom")
	_, err := r.Update(context.Background(), "main", func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
		return nil, "", boom
	})
	assert.ErrorIs(t, err, boom)
	assert.Equal(t, before, gittest.Rev(t, rm, "main"))
}

// TestUpdateSameContentTwice: two new files with the same contents (one blob)
// push cleanly.
func TestUpdateSameContentTwice(t *testing.T) {
	eachTransport(t, func(t *testing.T, rm remote) {
		r := open(t, gitsource.Options{URL: rm.url})
		tip, err := r.Update(context.Background(), "main", func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
			return map[string][]byte{"a.yaml": []byte("same\n"), "b/a.yaml": []byte("same\n"), "c/a.yaml": []byte("same\n")}, "twins", nil
		})
		require.NoError(t, err)
		assert.Equal(t, []string{"a.yaml", "b/a.yaml", "c/a.yaml"}, gittest.Files(t, rm.dir, tip))
		gittest.Git(t, rm.dir, "fsck", "--strict", "--no-dangling")
	})
}

// TestUpdateGivesUp: a writer that loses every race stops after
// UpdateAttempts with ErrConflict, or when its context ends with the
// context's error; nothing of its own is written.
func TestUpdateGivesUp(t *testing.T) {
	rm := gittest.NewBare(t)
	gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"a": "0"}})
	// Each attempt, someone else pushes first.
	n := 0
	loser := func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
		n++
		gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"other": fmt.Sprint(n)}})
		return map[string][]byte{"mine": []byte("x")}, "mine", nil
	}
	t.Run("attempts", func(t *testing.T) {
		n = 0
		r := open(t, gitsource.Options{URL: rm, UpdateAttempts: 3, Backoff: time.Millisecond})
		_, err := r.Update(context.Background(), "main", loser)
		assert.ErrorIs(t, err, gitsource.ErrConflict)
		assert.Equal(t, 3, n)
	})
	t.Run("context", func(t *testing.T) {
		n = 0
		r := open(t, gitsource.Options{URL: rm, UpdateAttempts: 1000, Backoff: 10 * time.Millisecond})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		_, err := r.Update(ctx, "main", func(tip string, read func(string) ([]byte, error)) (map[string][]byte, string, error) {
			if n == 4 {
				cancel()
			}
			return loser(tip, read)
		})
		assert.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, 5, n, "no attempt after the context ended")
	})
	assert.NotContains(t, gittest.Files(t, rm, "main"), "mine")
}

// TestUpdateRemovingOnNewBranch: removing paths from a branch that does not
// exist writes nothing (no empty root commit).
func TestUpdateRemovingOnNewBranch(t *testing.T) {
	rm := gittest.NewBare(t)
	gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"a": "0"}})
	r := open(t, gitsource.Options{URL: rm})
	tip, err := r.Update(context.Background(), "gitfleet/status", func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
		return map[string][]byte{"hosts/gone.yaml": nil}, "remove", nil
	})
	require.NoError(t, err)
	assert.Empty(t, tip)
	_, err = r.RemoteHead(context.Background(), "gitfleet/status")
	assert.ErrorIs(t, err, gitsource.ErrBranchNotFound)
}

// A write replaces an entry of another kind in its way: a directory
// planted where a file is written, a file planted where a directory is
// written under; a removal under a path that is written, or under a file,
// is no error. Someone who can push the branch planted them: before,
// every write of the controller (a host file) or of an agent (its status)
// failed for as long as they stayed.
func TestUpdateReplacesWhatIsInTheWay(t *testing.T) {
	rm := gittest.NewBare(t)
	gittest.Commit(t, rm, gittest.Edit{Branch: "gitfleet/status", Write: map[string]string{
		"hosts/hv-a.yaml/planted": "x\n", "hosts/hv-b.yaml/planted": "x\n", "logs": "a file\n", "keep.yaml": "k\n"}})
	r := open(t, gitsource.Options{URL: rm})
	tip, err := r.Update(context.Background(), "gitfleet/status", func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
		return map[string][]byte{
			"hosts/hv-a.yaml": []byte("status\n"), "hosts/hv-a.yaml/planted": nil,
			"hosts/hv-b.yaml": nil,
			"logs/today":      []byte("line\n"),
			"keep.yaml/under": nil,
		}, "write over", nil
	})
	require.NoError(t, err)
	assert.Equal(t, "status", gittest.Show(t, rm, tip, "hosts/hv-a.yaml"))
	assert.Equal(t, "line", gittest.Show(t, rm, tip, "logs/today"))
	assert.Equal(t, "k", gittest.Show(t, rm, tip, "keep.yaml"))
	assert.ElementsMatch(t, []string{"hosts/hv-a.yaml", "logs/today", "keep.yaml"}, gittest.Files(t, rm, tip))

	_, err = r.Update(context.Background(), "gitfleet/status", func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
		return map[string][]byte{"x": []byte("file\n"), "x/y": []byte("and a directory\n")}, "contradiction", nil
	})
	assert.ErrorContains(t, err, "also written as a directory")
}
