package gitsource

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-git/go-git/v5/plumbing/format/pktline"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/capability"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/sideband"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/utils/ioutil"
)

// The file transport. go-git's own runs git-upload-pack / git-receive-pack
// as a child and, when a context ends, kills that child and waits for its
// pipes to close: a child that stalls (a wrapper script, a hung network
// filesystem) and left a process holding the pipes blocks the wait for as
// long as that process lives, whatever the deadline. This one runs the
// server in its own process group, kills the whole group when the caller's
// context ends, and waits at most commandWaitDelay for the pipes after
// that. It speaks the same protocol (v0, pkt-lines) through go-git's packp
// encoders.
func init() {
	recordAdvertisements("file", fileTransport{})
}

// commandWaitDelay bounds the wait for a killed server's pipes, and for a
// server to exit on its own once the session is closed.
const commandWaitDelay = 2 * time.Second

// fileTransport implements transport.Transport for local repositories.
type fileTransport struct{}

var _ transport.Transport = fileTransport{}

func (fileTransport) NewUploadPackSession(ep *transport.Endpoint, _ transport.AuthMethod) (transport.UploadPackSession, error) {
	return startCommand(transport.UploadPackServiceName, ep.Path)
}

func (fileTransport) NewReceivePackSession(ep *transport.Endpoint, _ transport.AuthMethod) (transport.ReceivePackSession, error) {
	return startCommand(transport.ReceivePackServiceName, ep.Path)
}

// commandSession is one git-upload-pack or git-receive-pack process.
type commandSession struct {
	service string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	stdout  *bufio.Reader
	stderr  *headBuffer
	// kill ends the process group; it is called when a caller's context
	// ends, and by Close when the server does not exit by itself.
	kill    context.CancelFunc
	killed  chan struct{}
	advRefs *packp.AdvRefs
	packRun bool

	mu      sync.Mutex
	stops   []func() bool
	closed  bool
	waitErr error
}

// startCommand starts service (git-upload-pack or git-receive-pack) on the
// repository at dir: the git-<service> program on PATH, else `git <service>`.
func startCommand(service, dir string) (*commandSession, error) {
	name, args := service, []string{dir}
	if _, err := exec.LookPath(name); err != nil {
		name, args = "git", []string{strings.TrimPrefix(service, "git-"), dir}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	s := &commandSession{service: service, cmd: cmd, kill: cancel, killed: make(chan struct{}), stderr: &headBuffer{max: 4096}}
	cmd.Cancel = func() error {
		close(s.killed)
		// The negative pid names the process group: the server and
		// anything it started.
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = commandWaitDelay
	cmd.Stderr = s.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("start %s: %w", service, err)
	}
	s.stdin, s.stdout = stdin, bufio.NewReader(stdout)
	return s, nil
}

// watch kills the server when ctx ends, until Close.
func (s *commandSession) watch(ctx context.Context) {
	stop := context.AfterFunc(ctx, s.kill)
	s.mu.Lock()
	s.stops = append(s.stops, stop)
	s.mu.Unlock()
}

// failed turns an error of reading or writing the server into the error to
// return: the context's when it ended (the server was killed for it), the
// server's own complaint when it wrote one.
func (s *commandSession) failed(ctx context.Context, what string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("%s: %w (the git server was stopped)", what, cerr)
	}
	if msg := s.stderr.String(); msg != "" {
		if isRepoNotFound(msg) {
			return transport.ErrRepositoryNotFound
		}
		return fmt.Errorf("%s: %w: %s", what, err, msg)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (s *commandSession) AdvertisedReferences() (*packp.AdvRefs, error) {
	return s.AdvertisedReferencesContext(context.Background())
}

// AdvertisedReferencesContext reads the server's ref advertisement.
func (s *commandSession) AdvertisedReferencesContext(ctx context.Context) (*packp.AdvRefs, error) {
	if s.advRefs != nil {
		return s.advRefs, nil
	}
	s.watch(ctx)
	ar := packp.NewAdvRefs()
	err := ar.Decode(limitAdvertisement(s.stdout))
	switch {
	case err == nil:
	case errors.Is(err, packp.ErrEmptyAdvRefs):
		if s.service == transport.UploadPackServiceName {
			return nil, transport.ErrEmptyRemoteRepository
		}
	case errors.Is(err, packp.ErrEmptyInput):
		// The server wrote nothing: it failed; wait for its complaint.
		_ = s.wait()
		return nil, s.failed(ctx, "read ref advertisement", io.ErrUnexpectedEOF)
	default:
		var line *pktline.ErrorLine
		if errors.As(err, &line) && isRepoNotFound(line.Text) {
			return nil, transport.ErrRepositoryNotFound
		}
		return nil, s.failed(ctx, "read ref advertisement", fmt.Errorf("%w: %w", ErrRemoteAnswer, err))
	}
	if s.service == transport.UploadPackServiceName && ar.IsEmpty() {
		return nil, transport.ErrEmptyRemoteRepository
	}
	transport.FilterUnsupportedCapabilities(ar.Capabilities)
	s.advRefs = ar
	return ar, nil
}

// UploadPack sends the wants and haves and returns the server's answer;
// reading the answer's pack stays bounded by ctx, and closing the answer
// closes the session.
func (s *commandSession) UploadPack(ctx context.Context, req *packp.UploadPackRequest) (*packp.UploadPackResponse, error) {
	if req.IsEmpty() {
		return nil, errors.Join(transport.ErrEmptyUploadPackRequest, s.Close())
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if _, err := s.AdvertisedReferencesContext(ctx); err != nil {
		return nil, err
	}
	s.watch(ctx)
	s.packRun = true
	var buf bytes.Buffer
	if err := req.UploadRequest.Encode(&buf); err != nil {
		return nil, fmt.Errorf("encode upload request: %w", err)
	}
	if err := req.UploadHaves.Encode(&buf, true); err != nil {
		return nil, fmt.Errorf("encode haves: %w", err)
	}
	if err := pktline.NewEncoder(&buf).Encodef("done\n"); err != nil {
		return nil, err
	}
	if _, err := s.stdin.Write(buf.Bytes()); err != nil {
		return nil, s.failed(ctx, "send upload request", err)
	}
	if err := s.stdin.Close(); err != nil {
		return nil, s.failed(ctx, "send upload request", err)
	}
	r, err := ioutil.NonEmptyReader(s.stdout)
	if errors.Is(err, ioutil.ErrEmptyReader) {
		return nil, errors.Join(transport.ErrEmptyUploadPackRequest, s.Close())
	}
	if err != nil {
		return nil, s.failed(ctx, "read upload-pack answer", err)
	}
	res := packp.NewUploadPackResponse(req)
	if err := res.Decode(ioutil.NewReadCloser(limitShallow(r), s)); err != nil {
		if errors.Is(err, ErrTooManyShallows) {
			return nil, errors.Join(err, s.Close())
		}
		return nil, s.failed(ctx, "decode upload-pack answer", fmt.Errorf("%w: %w", ErrRemoteAnswer, err))
	}
	return res, nil
}

// ReceivePack sends the ref updates and the pack and reads the report.
func (s *commandSession) ReceivePack(ctx context.Context, req *packp.ReferenceUpdateRequest) (*packp.ReportStatus, error) {
	if _, err := s.AdvertisedReferencesContext(ctx); err != nil {
		return nil, err
	}
	s.watch(ctx)
	s.packRun = true
	if err := req.Encode(s.stdin); err != nil {
		return nil, s.failed(ctx, "send ref updates", err)
	}
	if err := s.stdin.Close(); err != nil {
		return nil, s.failed(ctx, "send ref updates", err)
	}
	if !req.Capabilities.Supports(capability.ReportStatus) {
		return nil, s.Close()
	}
	var r io.Reader = s.stdout
	var d *sideband.Demuxer
	switch {
	case req.Capabilities.Supports(capability.Sideband64k):
		d = sideband.NewDemuxer(sideband.Sideband64k, r)
	case req.Capabilities.Supports(capability.Sideband):
		d = sideband.NewDemuxer(sideband.Sideband, r)
	}
	if d != nil {
		d.Progress = req.Progress // the remote's messages (a hook's output)
		r = d
	}
	report := packp.NewReportStatus()
	if err := report.Decode(r); err != nil {
		return nil, errors.Join(s.failed(ctx, "read push report", err), s.Close())
	}
	if err := report.Error(); err != nil {
		_ = s.Close()
		return report, err
	}
	return report, s.Close()
}

// Close ends the session: a server that sent no pack is told so (a flush),
// then given commandWaitDelay to exit before its group is killed. It is
// safe to call more than once.
func (s *commandSession) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	stops := s.stops
	s.mu.Unlock()
	if !s.packRun {
		_, _ = s.stdin.Write(pktline.FlushPkt)
	}
	_ = s.stdin.Close()
	timer := time.AfterFunc(commandWaitDelay, s.kill)
	err := s.wait()
	timer.Stop()
	for _, stop := range stops {
		stop()
	}
	s.kill()
	select {
	case <-s.killed:
		return nil // killed for a deadline or a stall: the caller has that error
	default:
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return nil // a refusal the protocol already reported
	}
	return err
}

// wait waits for the server once.
func (s *commandSession) wait() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd.ProcessState == nil {
		s.waitErr = s.cmd.Wait()
	}
	return s.waitErr
}

// isRepoNotFound recognizes git's "not a repository" complaint.
func isRepoNotFound(msg string) bool {
	return strings.Contains(msg, "does not appear to be a git repository") ||
		strings.Contains(msg, "not a git repository")
}

// headBuffer keeps the first max bytes written to it (a server's stderr).
type headBuffer struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (b *headBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// String is what the server wrote, trimmed.
func (b *headBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(b.buf.String())
}
