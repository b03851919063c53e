package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Version is a restic release as `restic version` names it.
type Version struct {
	Major, Minor, Patch int
	// Raw is restic's whole version line.
	Raw string
}

// AtLeast reports whether v is major.minor.patch or newer.
func (v Version) AtLeast(major, minor, patch int) bool {
	if v.Major != major {
		return v.Major > major
	}
	if v.Minor != minor {
		return v.Minor > minor
	}
	return v.Patch >= patch
}

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// Features of newer restic releases this package uses when present.
func (v Version) retryLock() bool   { return v.AtLeast(0, 16, 0) }
func (v Version) restEnvAuth() bool { return v.AtLeast(0, 16, 1) }

var versionLine = regexp.MustCompile(`^restic (\d+)\.(\d+)\.(\d+)`)

// Version runs `restic version` (once per Repository; the answer is
// kept) and parses it. It needs neither the repository nor its password.
func (r *Repository) Version(ctx context.Context) (Version, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.version != nil {
		return *r.version, nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout())
	defer cancel()
	cmd := exec.CommandContext(ctx, r.binary(), "version")
	cmd.Env = baseEnv(r.TempDir)
	out, err := cmd.Output()
	if err != nil {
		return Version{}, &Error{Op: "version", ExitCode: -1, Err: err}
	}
	line := strings.TrimSpace(string(out))
	m := versionLine.FindStringSubmatch(line)
	if m == nil {
		return Version{}, &Error{Op: "version", ExitCode: -1, Err: fmt.Errorf("unrecognised version line %q", line)}
	}
	v := Version{Raw: line}
	v.Major, _ = strconv.Atoi(m[1])
	v.Minor, _ = strconv.Atoi(m[2])
	v.Patch, _ = strconv.Atoi(m[3])
	r.version = &v
	return v, nil
}

// locking are the commands that take a repository lock.
var locking = map[string]bool{"backup": true, "forget": true, "prune": true, "check": true, "dump": true, "snapshots": true}

// exclusive are the commands whose lock is restic's exclusive one.
var exclusive = map[string]bool{"forget": true, "prune": true, "check": true}

// begin prepares a session for op with what this restic version supports:
// --retry-lock for the commands that lock, and REST credentials from the
// environment file in a private --repository-file when restic reads no
// RESTIC_REST_* itself.
func (r *Repository) begin(ctx context.Context, op string) (*session, Version, error) {
	s, err := r.prepare(op)
	if err != nil {
		return nil, Version{}, err
	}
	v, err := r.Version(ctx)
	if err != nil {
		return nil, v, err
	}
	if v.retryLock() && locking[op] {
		s.global = append(s.global, "--retry-lock="+formatDuration(r.lockWait()))
	}
	if loc, _ := ParseURL(r.URL); loc.Backend == BackendREST && !v.restEnvAuth() {
		if err := r.restCredentialsFile(s); err != nil {
			s.cleanup()
			return nil, v, err
		}
	}
	return s, v, nil
}

// restCredentialsFile moves RESTIC_REST_USERNAME and RESTIC_REST_PASSWORD
// of s's environment into the repository URL, written to a 0600 file in
// the cache directory that restic reads with --repository-file and that
// s.cleanup removes: restic before 0.16.1 takes REST credentials only in
// the URL, and a URL on a command line is readable by every local user.
func (r *Repository) restCredentialsFile(s *session) error {
	var user, pass string
	var env []string
	for _, kv := range s.env {
		switch k, v, _ := strings.Cut(kv, "="); k {
		case "RESTIC_REST_USERNAME":
			user = v
		case "RESTIC_REST_PASSWORD":
			pass = v
		default:
			env = append(env, kv)
		}
	}
	if user == "" && pass == "" {
		return nil
	}
	raw := strings.TrimPrefix(r.URL, "rest:")
	u, err := url.Parse(raw)
	if err != nil {
		return configError("repository", "rest location: %v", err)
	}
	u.User = url.UserPassword(user, pass)
	if err := os.MkdirAll(r.CacheDir, 0o700); err != nil {
		return &Error{Op: "repository", ExitCode: -1, Err: err}
	}
	f, err := os.CreateTemp(r.CacheDir, ".repository-*")
	if err != nil {
		return &Error{Op: "repository", ExitCode: -1, Err: err}
	}
	full := "rest:" + u.String()
	_, err = f.WriteString(full + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return &Error{Op: "repository", ExitCode: -1, Err: err}
	}
	s.env = env
	s.secrets = append(s.secrets, full, u.User.String())
	for i, g := range s.global {
		if strings.HasPrefix(g, "--repo=") {
			s.global[i] = "--repository-file=" + f.Name()
		}
	}
	name := f.Name()
	s.cleanup = func() { os.Remove(name) }
	return nil
}

// proc is one running restic.
type proc struct {
	op     string
	cmd    *exec.Cmd
	s      *session
	stderr *tail
	done   chan struct{}
	err    error // cmd.Wait's, once done is closed

	mu      sync.Mutex
	stopped error // why it was stopped, nil when it exited by itself
}

// start runs restic with s's global arguments, then args, with its own
// process group so that stopping it also stops the ssh or rclone it runs.
func (r *Repository) start(s *session, op string, args []string, stdin io.Reader, stdout io.Writer) (*proc, error) {
	argv := append(append([]string{}, s.global...), args...)
	cmd := exec.Command(r.binary(), argv...)
	cmd.Env = s.env
	cmd.Stdin = stdin
	cmd.Stdout = stdout
	p := &proc{op: op, cmd: cmd, s: s, stderr: &tail{max: 2048}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	// Pdeathsig: an agent killed mid-stream closes restic's input, which
	// restic would take for the end of the disk and save; SIGINT first
	// makes it give up instead (a snapshot it saved anyway has no
	// manifest and is forgotten by the next retention).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGINT}
	if err := cmd.Start(); err != nil {
		return nil, &Error{Op: op, ExitCode: -1, Err: err}
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// interruptGrace is how long restic gets to clean up (remove its lock)
// after SIGINT before SIGKILL.
const interruptGrace = 10 * time.Second

// stop ends restic for reason: SIGINT to its process group (restic
// removes its lock and saves nothing), then SIGKILL after interruptGrace.
// It returns once restic exited and reports whether SIGKILL was needed
// (a killed restic leaves a stale lock behind).
func (p *proc) stop(reason error) (killed bool) {
	p.mu.Lock()
	if p.stopped == nil {
		p.stopped = reason
	}
	p.mu.Unlock()
	pgid := p.cmd.Process.Pid
	syscall.Kill(-pgid, syscall.SIGINT)
	select {
	case <-p.done:
		return false
	case <-time.After(interruptGrace):
	}
	syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.done
	return true
}

// result waits for restic and returns nil on exit status 0, else an
// *Error of its class.
func (p *proc) result() error {
	<-p.done
	p.mu.Lock()
	stopped := p.stopped
	p.mu.Unlock()
	code := -1
	if p.cmd.ProcessState != nil {
		code = p.cmd.ProcessState.ExitCode()
	}
	if p.err == nil && stopped == nil {
		return nil
	}
	stderr := p.s.redact(p.stderr.String())
	e := &Error{Op: p.op, ExitCode: code, Stderr: stderr}
	switch {
	case stopped != nil:
		e.Err = stopped
		var k *Error
		if errors.As(stopped, &k) {
			e.Kind = k.Kind
		} else if errors.Is(stopped, ErrTimeout) {
			e.Kind = ErrTimeout
		}
	default:
		e.Kind = classify(code, stderr)
		if code < 0 {
			e.Err = p.err
		}
	}
	return e
}

// runOnce runs restic once, bounded by timeout and ctx, and returns its
// standard output (at most maxOut bytes).
func (r *Repository) runOnce(ctx context.Context, s *session, op string, timeout time.Duration, args []string) ([]byte, error) {
	out := &limitedBuffer{max: maxOut}
	p, err := r.start(s, op, args, nil, out)
	if err != nil {
		return nil, err
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		if p.stop(fmt.Errorf("%w: no result within %s", ErrTimeout, timeout)) {
			r.unlockAfterKill(s)
		}
	case <-ctx.Done():
		if p.stop(ctx.Err()) {
			r.unlockAfterKill(s)
		}
	}
	if err := p.result(); err != nil {
		return nil, err
	}
	if out.over {
		return nil, &Error{Op: op, ExitCode: 0, Err: fmt.Errorf("output larger than %d bytes", maxOut)}
	}
	return out.Bytes(), nil
}

// maxOut bounds what is kept of restic's standard output (snapshot lists).
const maxOut = 256 << 20

// run runs op with args, waiting for a lock held by another restic up to
// LockWait: restic 0.16 and newer wait themselves (--retry-lock); for
// older ones each attempt that finds the repository locked is followed by
// an Unlock of stale locks and a pause.
func (r *Repository) run(ctx context.Context, op string, timeout time.Duration, args ...string) ([]byte, error) {
	s, v, err := r.begin(ctx, op)
	if err != nil {
		return nil, err
	}
	defer s.cleanup()
	deadline := time.Now().Add(r.lockWait())
	for pause := time.Second; ; pause = min(2*pause, 30*time.Second) {
		out, err := r.runOnce(ctx, s, op, timeout, args)
		if !errors.Is(err, ErrLocked) || v.retryLock() || time.Now().Add(pause).After(deadline) {
			return out, err
		}
		r.unlockStale(ctx, s)
		if !sleepCtx(ctx, pause) {
			return nil, err
		}
	}
}

// unlockStale runs `restic unlock`, which removes stale locks only; its
// failure is not the caller's.
func (r *Repository) unlockStale(ctx context.Context, s *session) {
	r.runOnce(ctx, s, "unlock", r.timeout(), []string{"unlock"})
}

// unlockAfterKill removes the stale lock a restic killed by SIGKILL left.
func (r *Repository) unlockAfterKill(s *session) {
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout())
	defer cancel()
	r.unlockStale(ctx, s)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// limitedBuffer keeps at most max bytes and notes when more came.
type limitedBuffer struct {
	bytes.Buffer
	max  int
	over bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); len(p) > room {
		b.over = true
		if room > 0 {
			b.Buffer.Write(p[:room])
		}
		return len(p), nil
	}
	return b.Buffer.Write(p)
}

// cacheDir makes sure restic's cache directory exists, private.
func (r *Repository) cacheDir() error {
	if err := os.MkdirAll(filepath.Clean(r.CacheDir), 0o700); err != nil {
		return &Error{Op: "repository", ExitCode: -1, Err: err}
	}
	return nil
}
