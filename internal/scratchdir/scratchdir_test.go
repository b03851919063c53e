package scratchdir_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/internal/scratchdir"
)

const prefix = "gitfleet-controller-"

// killedScratch makes a scratch directory in a child process and kills
// the child (SIGKILL) while it holds the directory, as the OOM killer
// would, and returns the directory left behind.
func killedScratch(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHoldScratch$")
	cmd.Env = append(os.Environ(), "SCRATCHDIR_HELPER=1")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	dir := strings.TrimSpace(strings.TrimPrefix(line, "dir="))
	require.DirExists(t, dir)
	return dir
}

// TestHelperHoldScratch makes a scratch directory, prints it and waits
// to be killed; it does nothing in a normal run.
func TestHelperHoldScratch(t *testing.T) {
	if os.Getenv("SCRATCHDIR_HELPER") == "" {
		return
	}
	dir, _, err := scratchdir.Make(prefix)
	if err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("dir=" + dir + "\n")
	select {}
}

// A scratch directory a killed process left is swept; everything else
// under the same temporary directory stays: a live process's, one
// without the marker, a file and a symbolic link named like one, another
// prefix's, and a directory whose marker is a link.
func TestSweepRemovesOnlyWhatKilledProcessesLeft(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	dead := killedScratch(t)
	require.FileExists(t, filepath.Join(dead, scratchdir.Marker))
	require.NoError(t, os.MkdirAll(filepath.Join(dead, "cache", "objects"), 0o700))

	live, done, err := scratchdir.Make(prefix)
	require.NoError(t, err)
	defer done()
	keep := map[string]func(string) error{
		prefix + "nomarker": func(p string) error { return os.Mkdir(p, 0o700) },
		prefix + "file":     func(p string) error { return os.WriteFile(p, nil, 0o600) },
		prefix + "link":     func(p string) error { return os.Symlink(dead, p) },
		prefix + "linkedmarker": func(p string) error {
			if err := os.Mkdir(p, 0o700); err != nil {
				return err
			}
			return os.Symlink(filepath.Join(dead, scratchdir.Marker), filepath.Join(p, scratchdir.Marker))
		},
		"other-tool-x": func(p string) error {
			if err := os.Mkdir(p, 0o700); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(p, scratchdir.Marker), nil, 0o600)
		},
	}
	for name, make := range keep {
		require.NoError(t, make(filepath.Join(tmp, name)), name)
	}

	swept := scratchdir.Sweep(prefix, nil)
	require.Equal(t, []string{dead}, swept)
	require.NoDirExists(t, dead)
	require.DirExists(t, live, "a running process's directory stays")
	for name := range keep {
		_, err := os.Lstat(filepath.Join(tmp, name))
		require.NoError(t, err, "%s stays", name)
	}
	require.Empty(t, scratchdir.Sweep(prefix, nil), "nothing more to sweep")

	done()
	require.NoDirExists(t, live, "done removes the directory")
}

// A marker that is a named pipe (opening one for reading waits for a
// writer) or a directory is not judged, and Sweep returns: a directory
// of this user that looks like a scratch directory never hangs the start
// of a command.
func TestSweepSkipsMarkersThatAreNoFiles(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	fifo := filepath.Join(tmp, prefix+"fifo")
	require.NoError(t, os.Mkdir(fifo, 0o700))
	require.NoError(t, syscall.Mkfifo(filepath.Join(fifo, scratchdir.Marker), 0o600))
	dir := filepath.Join(tmp, prefix+"dir")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, scratchdir.Marker), 0o700))

	swept := make(chan []string, 1)
	go func() { swept <- scratchdir.Sweep(prefix, nil) }()
	select {
	case got := <-swept:
		require.Empty(t, got)
	case <-time.After(time.Minute):
		// Let the stuck open return before failing.
		if w, err := os.OpenFile(filepath.Join(fifo, scratchdir.Marker), os.O_WRONLY, 0); err == nil {
			w.Close()
		}
		t.Fatal("Sweep hangs on a marker that is a named pipe")
	}
	require.DirExists(t, fifo)
	require.DirExists(t, dir)
}

// A directory of another user, with a marker nobody holds, stays.
func TestSweepLeavesOtherUsersDirectories(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving a directory to another user needs root")
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	other := filepath.Join(tmp, prefix+"other")
	require.NoError(t, os.Mkdir(other, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(other, scratchdir.Marker), nil, 0o600))
	require.NoError(t, os.Chown(other, 65534, 65534))
	require.Empty(t, scratchdir.Sweep(prefix, nil))
	require.DirExists(t, other)
}

// Sweeps running while directories are made and removed never remove
// one whose maker still runs (its marker is locked before it takes the
// name), and never report one its maker removed itself as left behind.
func TestSweepRacingMake(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	stop := make(chan struct{})
	swept := make(chan []string)
	go func() {
		var all []string
		for {
			select {
			case <-stop:
				swept <- all
				return
			default:
				all = append(all, scratchdir.Sweep(prefix, nil)...)
			}
		}
	}()
	for i := 0; i < 200; i++ {
		dir, done, err := scratchdir.Make(prefix)
		require.NoError(t, err)
		for j := 0; j < 3; j++ {
			require.FileExists(t, filepath.Join(dir, scratchdir.Marker), "a live directory keeps its marker")
			time.Sleep(time.Millisecond) // let sweeps run meanwhile
		}
		done()
	}
	close(stop)
	require.Empty(t, <-swept, "no directory was swept: each was live or removed by its maker")
}
