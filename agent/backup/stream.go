package backup

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// BackupRequest is one --stdin snapshot: Filename is the path the stream
// is stored under (relative, clean, "web-01/root.raw"; restic stores it
// as "/web-01/root.raw"), Host the snapshot's --host, Tags its --tag
// values, and Size the exact number of bytes the stream must yield (a
// disk's virtual size); Size < 0 checks no count (the meta snapshot).
type BackupRequest struct {
	Filename string
	Host     string
	Tags     []string
	Size     int64
}

// BackupResult is what restic's --json summary of a Backup says:
// SnapshotID the new snapshot's full id, BytesProcessed the bytes read
// from the stream, BytesAdded what the repository grew by (restic's
// data_added: new chunks after deduplication and compression, before
// pack overhead), Duration restic's own account of the run.
type BackupResult struct {
	SnapshotID     string
	BytesProcessed int64
	BytesAdded     int64
	Duration       time.Duration
}

func (q BackupRequest) check() error {
	if q.Filename == "" || path.IsAbs(q.Filename) || path.Clean(q.Filename) != q.Filename || strings.HasPrefix(q.Filename, "../") || q.Filename == ".." {
		return configError("backup", "stdin filename %q: want a clean relative path", q.Filename)
	}
	if strings.ContainsAny(q.Filename, "\x00\n") || q.Host == "" || strings.ContainsAny(q.Host, ", \t\n") {
		return configError("backup", "stdin filename %q or host %q: control characters, or no host", q.Filename, q.Host)
	}
	return checkTags("backup", q.Tags)
}

// replayKeep is how much of a stream's start Backup keeps to feed a
// second restic when the first found the repository locked before it
// read anything: more than any pipe buffers.
const replayKeep = 4 << 20

// Backup stores stream as one snapshot (restic backup --stdin --json) and
// returns restic's summary. The snapshot exists only if stream ended with
// io.EOF after exactly req.Size bytes (when Size >= 0) and restic exited
// 0; on a stream error, a wrong count, ctx's end or IdleTimeout, restic is
// interrupted before its input ends (it saves nothing) and the error is
// ErrProducer, the context's error or ErrTimeout. A snapshot restic saved
// but reported incomplete (exit 3), or whose byte count disagrees with
// what was fed, is forgotten again before the error returns. A lock held
// by another restic that conflicts (prune) is waited for up to LockWait.
// Backup reads stream from one goroutine; it does not close it.
func (r *Repository) Backup(ctx context.Context, stream io.Reader, req BackupRequest) (BackupResult, error) {
	if err := req.check(); err != nil {
		return BackupResult{}, err
	}
	s, v, err := r.begin(ctx, "backup")
	if err != nil {
		return BackupResult{}, err
	}
	defer s.cleanup()
	src := &replay{r: stream, keep: replayKeep}
	deadline := time.Now().Add(r.lockWait())
	for pause := time.Second; ; pause = min(2*pause, 30*time.Second) {
		res, err := r.backupOnce(ctx, s, src, req)
		if !errors.Is(err, ErrLocked) || v.retryLock() || !src.rewind() || time.Now().Add(pause).After(deadline) {
			return res, err
		}
		r.unlockStale(ctx, s)
		if !sleepCtx(ctx, pause) {
			return res, err
		}
	}
}

// summary is restic backup's --json summary message.
type summary struct {
	MessageType    string  `json:"message_type"`
	SnapshotID     string  `json:"snapshot_id"`
	DataAdded      int64   `json:"data_added"`
	BytesProcessed int64   `json:"total_bytes_processed"`
	Duration       float64 `json:"total_duration"`
}

func (r *Repository) backupOnce(ctx context.Context, s *session, src *replay, req BackupRequest) (BackupResult, error) {
	args := []string{"backup", "--json", "--stdin", "--stdin-filename=" + req.Filename, "--host=" + req.Host}
	for _, t := range req.Tags {
		args = append(args, "--tag="+t)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return BackupResult{}, &Error{Op: "backup", ExitCode: -1, Err: err}
	}
	outR, outW := io.Pipe()
	p, err := r.start(s, "backup", args, pr, outW)
	pr.Close()
	if err != nil {
		pw.Close()
		return BackupResult{}, err
	}
	var activity atomic.Int64
	touch := func() { activity.Store(time.Now().UnixNano()) }
	touch()
	// While the stream is fed only its bytes count as activity (restic
	// prints a status line every second regardless); once its input
	// ended, restic's output does (it saves the index and snapshot).
	var inputDone atomic.Bool
	sum := make(chan summary, 1)
	go func() {
		sum <- readSummary(outR, func() {
			if inputDone.Load() {
				touch()
			}
		})
	}()
	go func() { <-p.done; outW.Close() }()

	fed := make(chan feedResult, 1)
	go func() { fed <- feed(pw, src, req.Size, touch) }()
	stop := r.watch(ctx, p, &activity)
	var fr feedResult
	select {
	case fr = <-fed:
	case why := <-stop:
		r.abort(p, s, why)
		pw.Close()
		return BackupResult{}, p.result()
	}
	switch {
	case fr.resticGone:
		// restic stopped reading: its own exit says why.
		pw.Close()
		<-p.done
		return BackupResult{}, p.result()
	case fr.err != nil:
		// Interrupt restic while its input is still open: it must never
		// see the end of a stream that is not whole.
		r.abort(p, s, &Error{Op: "backup", Kind: ErrProducer, ExitCode: -1, Err: fr.err})
		pw.Close()
		return BackupResult{}, p.result()
	}
	inputDone.Store(true)
	touch()
	pw.Close()
	select {
	case <-p.done:
	case why := <-stop:
		r.abort(p, s, why)
	}
	res := <-sum
	if err := p.result(); err != nil {
		if res.SnapshotID != "" {
			r.forgetOwn(s, res.SnapshotID)
		}
		return BackupResult{}, err
	}
	return r.checkSummary(ctx, s, res, fr.n)
}

// checkSummary turns restic's summary into a BackupResult with the full
// snapshot id (restic 0.14 prints the short one), and forgets the
// snapshot when restic read other than the n bytes fed.
func (r *Repository) checkSummary(ctx context.Context, s *session, res summary, n int64) (BackupResult, error) {
	if res.SnapshotID == "" {
		return BackupResult{}, &Error{Op: "backup", ExitCode: 0, Err: errors.New("restic exited 0 without a summary naming a snapshot")}
	}
	if res.BytesProcessed != n {
		r.forgetOwn(s, res.SnapshotID)
		return BackupResult{}, &Error{Op: "backup", Kind: ErrProducer, ExitCode: 0,
			Err: fmt.Errorf("restic stored %d bytes of the %d fed; snapshot %s forgotten", res.BytesProcessed, n, res.SnapshotID)}
	}
	id := res.SnapshotID
	if len(id) < 64 {
		snap, err := r.snapshotByID(ctx, id)
		if err != nil {
			return BackupResult{}, err
		}
		id = snap.ID
	}
	return BackupResult{SnapshotID: id, BytesProcessed: res.BytesProcessed, BytesAdded: res.DataAdded,
		Duration: time.Duration(res.Duration * float64(time.Second))}, nil
}

// forgetOwn forgets a snapshot this Backup itself just made and must not
// count; best effort (the caller's error says why it failed, and a
// snapshot missing its meta snapshot never counts anyway).
func (r *Repository) forgetOwn(s *session, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout())
	defer cancel()
	r.runOnce(ctx, s, "forget", r.timeout(), []string{"forget", id})
}

// abort stops restic for why and removes the stale lock a SIGKILL left.
func (r *Repository) abort(p *proc, s *session, why error) {
	if p.stop(why) {
		r.unlockAfterKill(s)
	}
}

// watch reports, once, why restic must stop: ctx ended, or nothing moved
// (activity was not touched) for IdleTimeout. The channel stays silent
// while restic is busy, and is abandoned once restic is done.
func (r *Repository) watch(ctx context.Context, p *proc, activity *atomic.Int64) <-chan error {
	idle := r.idleTimeout()
	why := make(chan error, 1)
	go func() {
		tick := time.NewTicker(min(idle/4, time.Second))
		defer tick.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-ctx.Done():
				why <- ctx.Err()
				return
			case <-tick.C:
				if since := time.Since(time.Unix(0, activity.Load())); since > idle {
					why <- fmt.Errorf("%w: nothing moved for %s", ErrTimeout, idle)
					return
				}
			}
		}
	}()
	return why
}

// readSummary reads restic's --json lines, noting each as activity, and
// returns the summary message (zero when none came).
func readSummary(r io.Reader, touch func()) summary {
	var last summary
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			touch()
			var m summary
			if json.Unmarshal(line, &m) == nil && m.MessageType == "summary" {
				last = m
			}
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue // a status line longer than the buffer: not the summary
		case err != nil:
			io.Copy(io.Discard, r)
			return last
		}
	}
}

// feedResult is what feed did: n bytes written, and why it stopped when
// the stream was not whole.
type feedResult struct {
	n          int64
	err        error
	resticGone bool // the write to restic failed
}

// feed copies src to w until src's io.EOF. It returns an error, leaving
// w open, when src fails or yields other than size bytes (size >= 0), or
// when w fails (restic died; its own error says why).
func feed(w io.Writer, src io.Reader, size int64, touch func()) feedResult {
	buf := make([]byte, 1<<20)
	var n int64
	for {
		k, err := src.Read(buf)
		if k > 0 {
			if size >= 0 && n+int64(k) > size {
				return feedResult{n: n, err: fmt.Errorf("stream longer than its %d bytes", size)}
			}
			if _, werr := w.Write(buf[:k]); werr != nil {
				return feedResult{n, werr, true}
			}
			n += int64(k)
			touch()
		}
		switch {
		case errors.Is(err, io.EOF):
			if size >= 0 && n != size {
				return feedResult{n: n, err: fmt.Errorf("stream ended after %d of its %d bytes", n, size)}
			}
			return feedResult{n: n}
		case err != nil:
			return feedResult{n: n, err: err}
		}
	}
}

// replay reads r and keeps its first keep bytes, so that a second
// attempt can be fed the same stream while nothing beyond them was read.
type replay struct {
	mu   sync.Mutex
	r    io.Reader
	keep int
	kept []byte
	read int64
	pos  int  // replay position in kept, while replaying
	over bool // more than keep bytes were read: no rewind
}

func (p *replay) Read(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pos < len(p.kept) {
		n := copy(b, p.kept[p.pos:])
		p.pos += n
		return n, nil
	}
	n, err := p.r.Read(b)
	p.read += int64(n)
	if !p.over && len(p.kept)+n <= p.keep {
		p.kept = append(p.kept, b[:n]...)
		p.pos = len(p.kept)
	} else if n > 0 {
		p.over, p.kept = true, nil
	}
	return n, err
}

// rewind starts the stream over from its first byte; false when more
// than keep bytes were read already.
func (p *replay) rewind() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.over {
		return false
	}
	p.pos = 0
	return true
}

// Dump streams the file at path (a --stdin filename such as
// "web-01/root.raw", or "/web-01/root.raw") of snapshot id (restic dump).
// The reader's Read returns io.EOF only after restic exited 0, so a dump
// cut short reads as an error (its *Error), never as the end of the file;
// IdleTimeout stops a dump that moves nothing. Close stops restic if it
// still runs and releases everything; it must be called.
func (r *Repository) Dump(ctx context.Context, id, file string) (io.ReadCloser, error) {
	if !snapshotID.MatchString(id) {
		return nil, configError("dump", "snapshot id %q: want 8 to 64 lowercase hex digits", id)
	}
	file = "/" + strings.TrimPrefix(file, "/")
	if path.Clean(file) != file || strings.ContainsAny(file, "\x00\n") {
		return nil, configError("dump", "path %q: want a clean path", file)
	}
	s, _, err := r.begin(ctx, "dump")
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		s.cleanup()
		return nil, &Error{Op: "dump", ExitCode: -1, Err: err}
	}
	p, err := r.start(s, "dump", []string{"dump", id, file}, nil, outW)
	outW.Close()
	if err != nil {
		outR.Close()
		s.cleanup()
		return nil, err
	}
	d := &dump{r: r, p: p, s: s, out: outR}
	d.activity.Store(time.Now().UnixNano())
	d.why = r.watch(ctx, p, &d.activity)
	go func() {
		select {
		case why := <-d.why:
			r.abort(p, s, why)
		case <-p.done:
		}
	}()
	return d, nil
}

// DumpTo writes what Dump streams to w and returns the byte count.
func (r *Repository) DumpTo(ctx context.Context, w io.Writer, id, file string) (int64, error) {
	rc, err := r.Dump(ctx, id, file)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(w, rc)
	if cerr := rc.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// dump is the reader Dump returns.
type dump struct {
	r        *Repository
	p        *proc
	s        *session
	out      *os.File
	activity atomic.Int64
	why      <-chan error
	once     sync.Once
	err      error
}

func (d *dump) Read(b []byte) (int, error) {
	n, err := d.out.Read(b)
	if n > 0 {
		d.activity.Store(time.Now().UnixNano())
	}
	if errors.Is(err, io.EOF) {
		if rerr := d.p.result(); rerr != nil {
			return n, rerr
		}
	}
	return n, err
}

func (d *dump) Close() error {
	d.once.Do(func() {
		select {
		case <-d.p.done:
		default:
			d.r.abort(d.p, d.s, errors.New("dump closed before its end"))
		}
		d.out.Close()
		d.s.cleanup()
		d.err = d.p.result()
	})
	return d.err
}
