// Package e2etest is what the end-to-end tests (e2e, e2e/systemd) share:
// pushing to a fleet repository as a person would, and reading what the
// controller and the agent wrote to its branches (a host's snapshot on
// gitfleet/snapshots, its status on gitfleet/hosts/<host>) straight from the
// bare repository with git.
package e2etest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// Push writes the files of write (path → content) and removes those of
// remove in the working clone work, commits as "E2E Person", pushes HEAD
// to the remote's main, and returns the commit.
func Push(t testing.TB, work, msg string, write map[string]string, remove ...string) string {
	t.Helper()
	for p, content := range write {
		full := filepath.Join(work, filepath.FromSlash(p))
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(content), 0o644))
	}
	for _, p := range remove {
		require.NoError(t, os.Remove(filepath.Join(work, filepath.FromSlash(p))))
	}
	gittest.Git(t, work, "add", "-A")
	gittest.Git(t, work, "-c", "user.name=E2E Person", "-c", "user.email=person@example.com", "commit", "--quiet", "-m", msg)
	gittest.Git(t, work, "push", "--quiet", "origin", "HEAD:main")
	return gittest.Git(t, work, "rev-parse", "HEAD")
}

// Show reads branch:path in the bare repository; ok is false when absent.
func Show(bare, branch, path string) ([]byte, bool) {
	out, err := exec.Command("git", "--git-dir", bare, "show", branch+":"+path).Output()
	return out, err == nil
}

// Status is host's status file on its host branch (gitfleet/hosts/<host>,
// where its agent writes it), nil before its agent wrote one; a file that
// does not parse fails the test.
func Status(t testing.TB, bare, host string) *status.Status {
	t.Helper()
	b, ok := Show(bare, status.HostBranch(host), status.Path(host))
	if !ok {
		return nil
	}
	st, err := status.Parse(status.Path(host), b)
	require.NoError(t, err)
	return st
}

// Writes counts host's status writes as a poll sees them: each call of
// its function reads the host branch's tip and returns how many times it
// has moved since Writes was called. Every write moves it (an idle
// unsigned agent's heartbeats alternate between two commits, so the
// heartbeat number is no count of writes); two writes between polls count
// as one at most, so poll faster than the agent writes.
func Writes(t testing.TB, bare, host string) func() int {
	t.Helper()
	last, moves := hostTip(bare, host), 0
	return func() int {
		if tip := hostTip(bare, host); tip != last {
			last, moves = tip, moves+1
		}
		return moves
	}
}

// hostTip is host's branch tip in bare, "" when there is none.
func hostTip(bare, host string) string {
	out, err := exec.Command("git", "--git-dir", bare, "rev-parse", "--verify", "--quiet", "refs/heads/"+status.HostBranch(host)).Output()
	if err != nil {
		return ""
	}
	return string(out)
}

// Snapshot is host's snapshot on gitfleet/snapshots, nil before the
// controller published one; a file that does not parse fails the test.
func Snapshot(t testing.TB, bare, host string) *snapshots.Snapshot {
	t.Helper()
	b, ok := Show(bare, agent.SnapshotsBranch, snapshots.Path(host))
	if !ok {
		return nil
	}
	s, err := snapshots.ParseSnapshot(b)
	require.NoError(t, err)
	return s
}

// BuildBinary builds cmd/gitfleet into a new temporary directory named
// after prefix and returns the binary's path; remove drops the directory.
// For a TestMain: the error carries go build's output.
func BuildBinary(prefix string) (binary string, remove func(), err error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", nil, err
	}
	remove = func() { os.RemoveAll(dir) }
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	binary = filepath.Join(dir, "gitfleet")
	if out, err := exec.Command(goBin, "build", "-o", binary, "github.com/gitfleet/gitfleet/cmd/gitfleet").CombinedOutput(); err != nil {
		remove()
		return "", nil, fmt.Errorf("go build gitfleet: %v\n%s", err, out)
	}
	return binary, remove, nil
}
