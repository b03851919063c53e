package gittest

import (
	"fmt"
	"net"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// Fault is a misbehaviour a faulty git server injects.
type Fault int

// The faults, as operators meet them.
const (
	// NoFault: the server answers normally.
	NoFault Fault = iota
	// Stall: the server accepts the connection (or starts) and never
	// answers.
	Stall
	// StallAfter: the server sends its first FaultBytes bytes of the
	// answer, then stalls.
	StallAfter
	// Reset: the server sends its first FaultBytes bytes, then drops the
	// connection (a TCP reset over http; the server exiting for a local
	// repository).
	Reset
)

func (f Fault) String() string {
	return [...]string{"none", "stall", "stall after N bytes", "reset mid-answer"}[f]
}

// FaultyServer serves the bare repositories under a root, over http (git
// http-backend) and as a local repository reached through a wrapper
// git-upload-pack put first on PATH, with a fault switched on and off at
// run time. A stall lasts until the fault is switched off or the test ends.
type FaultyServer struct {
	// HTTPURL is the base URL: the repository root/x.git is HTTPURL+"/x.git".
	HTTPURL string

	mu      sync.Mutex
	fault   Fault
	n       int
	release chan struct{}
	dir     string // holds the wrapper's switch files
}

// ServeFaulty serves the repositories under root with switchable faults
// until the test ends. It puts a git-upload-pack wrapper first on PATH
// (t.Setenv, so the test must not be parallel): fetches of local
// repositories then go through it.
func ServeFaulty(t testing.TB, root string) *FaultyServer {
	t.Helper()
	NeedGit(t)
	gitBin, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	f := &FaultyServer{release: make(chan struct{}), dir: t.TempDir()}
	backend := &cgi.Handler{
		Path: gitBin,
		Args: []string{"http-backend"},
		Env:  []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null"},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		fault, n, release := f.state()
		if fault == Stall {
			select {
			case <-release:
			case <-req.Context().Done():
				return
			}
		}
		rec := httptest.NewRecorder()
		backend.ServeHTTP(rec, req)
		if fault == NoFault || fault == Stall || rec.Body.Len() <= n {
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			_, _ = w.Write(rec.Body.Bytes())
			return
		}
		// Headers without a length, so the client reads the body as it
		// comes; then the first n bytes of it.
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes()[:n])
		w.(http.Flusher).Flush()
		if fault == StallAfter {
			select {
			case <-release:
			case <-req.Context().Done():
			}
			return
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // a reset, not an orderly close
		}
		_ = conn.Close()
	}))
	t.Cleanup(func() {
		f.Set(NoFault, 0)
		srv.CloseClientConnections()
		srv.Close()
	})
	f.HTTPURL = srv.URL

	// The wrapper: with no switch file, it is git-upload-pack; with one,
	// it misbehaves as the file says (dd copies byte by byte: head would
	// hold the advertisement in its buffer). It stays a shell with a child, as
	// wrappers are, so a client must end the whole process group.
	bin := filepath.Join(f.dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`#!/bin/sh
sw=%q
if [ ! -f "$sw" ]; then exec %q upload-pack "$@"; fi
read -r fault n < "$sw"
case "$fault" in
stall) sleep 3600 ;;
stallafter) %q upload-pack "$@" | dd bs=1 count="$n" status=none; sleep 3600 ;;
reset) %q upload-pack "$@" | dd bs=1 count="$n" status=none ;;
esac
`, f.switchFile(), gitBin, gitBin, gitBin)
	if err := os.WriteFile(filepath.Join(bin, "git-upload-pack"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	return f
}

func (f *FaultyServer) switchFile() string { return filepath.Join(f.dir, "fault") }

func (f *FaultyServer) state() (Fault, int, chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fault, f.n, f.release
}

// Set switches the fault on (n bytes for StallAfter and Reset) or, with
// NoFault, off: requests stalled so far are then answered (http) or left
// to their client's deadline (a stalled local server).
func (f *FaultyServer) Set(fault Fault, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fault == Stall || f.fault == StallAfter {
		close(f.release)
		f.release = make(chan struct{})
	}
	f.fault, f.n = fault, n
	if fault == NoFault {
		_ = os.Remove(f.switchFile())
		return
	}
	word := map[Fault]string{Stall: "stall", StallAfter: "stallafter", Reset: "reset"}[fault]
	_ = os.WriteFile(f.switchFile(), []byte(fmt.Sprintf("%s %d\n", word, n)), 0o644)
}
