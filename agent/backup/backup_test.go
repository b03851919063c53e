package backup

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// These tests run the real restic against repositories in t.TempDir():
// local directories here, sftp and rest servers in sftp_test.go.

func needRestic(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("restic"); err != nil {
		t.Skip("restic not installed (scripts/install-deps.sh installs it)")
	}
}

const testPassword = "correct horse battery staple"

// newRepo returns a Repository for a fresh local repository, initialized.
func newRepo(t testing.TB) *Repository {
	t.Helper()
	needRestic(t)
	dir := t.TempDir()
	r := &Repository{
		URL:          filepath.Join(dir, "repo"),
		PasswordFile: writeSecret(t, dir, "password", testPassword+"\n"),
		CacheDir:     filepath.Join(dir, "cache"),
		Timeout:      time.Minute,
		LockWait:     5 * time.Second,
	}
	if err := r.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return r
}

func writeSecret(t testing.TB, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func randomBytes(t testing.TB, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func diskRequest(vm, disk, id string, size int) BackupRequest {
	return BackupRequest{Filename: DiskFilename(vm, disk), Host: "hv-a", Tags: DiskTags(vm, disk, id), Size: int64(size)}
}

func TestBackupDumpRoundTrip(t *testing.T) {
	r := newRepo(t)
	ctx := context.Background()
	data := randomBytes(t, 3<<20+17)
	res, err := r.Backup(ctx, bytes.NewReader(data), diskRequest("web-01", "root", "b1", len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.SnapshotID) != 64 || res.BytesProcessed != int64(len(data)) || res.BytesAdded < int64(len(data)) {
		t.Fatalf("result %+v: want a full id, %d bytes processed and at least as many added (random data)", res, len(data))
	}
	snaps, err := r.Snapshots(ctx, Filter{Host: "hv-a", Tags: []string{TagOwner, TagVM("web-01")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(snaps) != 1 || snaps[0].ID != res.SnapshotID || !snaps[0].HasTag(TagBackup("b1")) || snaps[0].Paths[0] != "/web-01/root.raw" {
		t.Fatalf("snapshots %+v, want the one backup with its tags and path", snaps)
	}
	var out bytes.Buffer
	n, err := r.DumpTo(ctx, &out, res.SnapshotID, DiskFilename("web-01", "root"))
	if err != nil || n != int64(len(data)) || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("dump: %d bytes, err %v; equal %v", n, err, bytes.Equal(out.Bytes(), data))
	}
	// By hand, with restic alone, as docs/DESIGN.md says a person restores.
	cmd := exec.Command("restic", "-r", r.URL, "--cache-dir", r.CacheDir, "dump", res.SnapshotID[:8], "web-01/root.raw")
	cmd.Env = append(os.Environ(), "RESTIC_PASSWORD_FILE="+r.PasswordFile)
	byHand, err := cmd.Output()
	if err != nil || !bytes.Equal(byHand, data) {
		t.Fatalf("restic dump by hand: %v (equal %v)", err, bytes.Equal(byHand, data))
	}
}

// failingReader yields n bytes of data, then err.
type failingReader struct {
	data []byte
	err  error
}

func (f *failingReader) Read(b []byte) (int, error) {
	if len(f.data) == 0 {
		return 0, f.err
	}
	n := copy(b, f.data)
	f.data = f.data[n:]
	return n, nil
}

// A stream that fails, ends short or runs long never becomes a snapshot:
// restic is interrupted while its input is still open.
func TestBackupOfABrokenStreamCountsNothing(t *testing.T) {
	r := newRepo(t)
	ctx := context.Background()
	data := randomBytes(t, 2<<20)
	size := len(data)
	for _, tc := range []struct {
		name   string
		stream io.Reader
		size   int
	}{
		{"producer fails", &failingReader{data: data[:1<<20], err: errors.New("nbd read: connection reset")}, size},
		{"ends short", bytes.NewReader(data[:size-4096]), size},
		{"runs long", bytes.NewReader(data), size - 4096},
		{"empty", bytes.NewReader(nil), size},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.Backup(ctx, tc.stream, diskRequest("web-01", "root", "broken", tc.size))
			if !errors.Is(err, ErrProducer) {
				t.Fatalf("err %v, want ErrProducer", err)
			}
		})
	}
	snaps, err := r.Snapshots(ctx, Filter{Tags: []string{TagBackup("broken")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(snaps) != 0 {
		t.Fatalf("a broken stream was kept as %d snapshots: %+v", len(snaps), snaps)
	}
	if locks, _ := os.ReadDir(filepath.Join(r.URL, "locks")); len(locks) != 0 {
		t.Errorf("interrupted backups left %d locks", len(locks))
	}
}

// slowReader yields its data a chunk at a time until released, then
// blocks until ctx ends.
type slowReader struct {
	chunk []byte
	n     int
	ctx   context.Context
}

func (s *slowReader) Read(b []byte) (int, error) {
	if s.n == 0 {
		<-s.ctx.Done()
		return 0, s.ctx.Err()
	}
	s.n--
	return copy(b, s.chunk), nil
}

func TestBackupCancelledMidStreamCountsNothing(t *testing.T) {
	r := newRepo(t)
	ctx, cancel := context.WithCancel(context.Background())
	src := &slowReader{chunk: randomBytes(t, 1<<20), n: 3, ctx: context.Background()}
	blocking, release := context.WithCancel(context.Background())
	defer release()
	src.ctx = blocking
	go func() { time.Sleep(2 * time.Second); cancel() }()
	_, err := r.Backup(ctx, src, diskRequest("web-01", "root", "cancelled", 10<<20))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	snaps, _ := r.Snapshots(context.Background(), Filter{Tags: []string{TagBackup("cancelled")}})
	if len(snaps) != 0 {
		t.Fatalf("a cancelled backup was kept: %+v", snaps)
	}
}

func TestBackupIdleStreamIsBounded(t *testing.T) {
	r := newRepo(t)
	r.IdleTimeout = 2 * time.Second
	blocking, release := context.WithCancel(context.Background())
	defer release()
	src := &slowReader{chunk: randomBytes(t, 1<<20), n: 1, ctx: blocking}
	start := time.Now()
	_, err := r.Backup(context.Background(), src, diskRequest("web-01", "root", "idle", 10<<20))
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err %v after %s, want ErrTimeout", err, time.Since(start))
	}
}

func TestWrongPasswordMissingRepositoryAndInitTwice(t *testing.T) {
	r := newRepo(t)
	ctx := context.Background()
	if err := r.Init(ctx); !errors.Is(err, ErrRepositoryExists) {
		t.Errorf("second init: %v, want ErrRepositoryExists", err)
	}
	wrong := *r.clone()
	wrong.PasswordFile = writeSecret(t, t.TempDir(), "password", "not the password")
	_, err := wrong.Snapshots(ctx, Filter{})
	if !errors.Is(err, ErrWrongPassword) {
		t.Errorf("wrong password: %v, want ErrWrongPassword", err)
	}
	if strings.Contains(err.Error(), "not the password") {
		t.Errorf("error quotes the password: %v", err)
	}
	missing := *r.clone()
	missing.URL = filepath.Join(t.TempDir(), "nothing-here")
	if _, err := missing.Snapshots(ctx, Filter{}); !errors.Is(err, ErrRepositoryMissing) {
		t.Errorf("missing repository: %v, want ErrRepositoryMissing", err)
	}
	if _, err := os.Stat(missing.URL); err == nil {
		t.Errorf("a missing repository was created")
	}
}

// clone copies r's configuration (not its cached state).
func (r *Repository) clone() *Repository {
	return &Repository{URL: r.URL, PasswordFile: r.PasswordFile, EnvironmentFile: r.EnvironmentFile,
		SSHKey: r.SSHKey, KnownHosts: r.KnownHosts, SFTPCommand: r.SFTPCommand, CacheDir: r.CacheDir,
		Restic: r.Restic, Timeout: r.Timeout, IdleTimeout: r.IdleTimeout, LockWait: r.LockWait}
}

func TestPasswordFileOthersCanReadIsRefused(t *testing.T) {
	r := newRepo(t)
	if err := os.Chmod(r.PasswordFile, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Snapshots(context.Background(), Filter{}); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("err %v, want ErrConfig asking for chmod 600", err)
	}
}

// startHeldBackup starts restic itself on a backup whose input never
// ends, so it holds the repository's shared lock, and returns it.
func startHeldBackup(t *testing.T, r *Repository) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("restic", "-r", r.URL, "--cache-dir", r.CacheDir, "backup", "--stdin", "--stdin-filename", "held.raw", "--host", "other")
	cmd.Env = append(os.Environ(), "RESTIC_PASSWORD_FILE="+r.PasswordFile)
	w, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); w.Close() })
	w.Write([]byte("some bytes"))
	deadline := time.Now().Add(30 * time.Second)
	for {
		if locks, _ := os.ReadDir(filepath.Join(r.URL, "locks")); len(locks) > 0 {
			return cmd
		}
		if time.Now().After(deadline) {
			t.Fatal("restic took no lock")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A restic killed with SIGKILL leaves its lock; Unlock removes it because
// its process is gone, and leaves a live restic's lock alone.
func TestStaleLockOfAKilledResticIsRecovered(t *testing.T) {
	r := newRepo(t)
	ctx := context.Background()
	if _, err := r.Backup(ctx, bytes.NewReader([]byte("x")), BackupRequest{Filename: "a.raw", Host: "hv-a", Tags: []string{TagOwner}, Size: 1}); err != nil {
		t.Fatal(err)
	}
	live := startHeldBackup(t, r)
	// A prune needs the exclusive lock: a live backup holds it off, for
	// LockWait and no longer.
	start := time.Now()
	if err := r.Prune(ctx); !errors.Is(err, ErrLocked) {
		t.Fatalf("prune beside a live backup: %v, want ErrLocked", err)
	}
	if took := time.Since(start); took > r.LockWait+time.Minute {
		t.Errorf("prune waited %s for a lock, LockWait is %s", took, r.LockWait)
	}
	if err := r.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if locks, _ := os.ReadDir(filepath.Join(r.URL, "locks")); len(locks) != 1 {
		t.Fatalf("unlock removed a live restic's lock (%d locks left)", len(locks))
	}
	live.Process.Kill() // kill -9: no cleanup, the lock stays
	live.Wait()
	if locks, _ := os.ReadDir(filepath.Join(r.URL, "locks")); len(locks) != 1 {
		t.Fatalf("%d locks after kill -9, want the stale one", len(locks))
	}
	if err := r.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if locks, _ := os.ReadDir(filepath.Join(r.URL, "locks")); len(locks) != 0 {
		t.Fatalf("unlock left %d stale locks", len(locks))
	}
	if err := r.Prune(ctx); err != nil {
		t.Fatalf("prune after unlock: %v", err)
	}
}

// Several hosts back up into one repository at once (restic's shared
// lock).
func TestConcurrentBackupsFromSeveralHosts(t *testing.T) {
	r := newRepo(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			data := randomBytes(t, 1<<20)
			req := diskRequest("vm", "root", "c", len(data))
			req.Host = fmt.Sprintf("hv-%d", i)
			_, errs[i] = r.Backup(ctx, bytes.NewReader(data), req)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("host %d: %v", i, err)
		}
	}
	snaps, err := r.Snapshots(ctx, Filter{Tags: []string{TagBackup("c")}})
	if err != nil || len(snaps) != 3 {
		t.Fatalf("%d snapshots (%v), want 3", len(snaps), err)
	}
}

// Forget touches only gitfleet's snapshots of its host and VM.
func TestForgetIsScopedToOwnTagsAndHost(t *testing.T) {
	r := newRepo(t)
	ctx := context.Background()
	put := func(host string, tags ...string) string {
		data := randomBytes(t, 4096)
		res, err := r.Backup(ctx, bytes.NewReader(data), BackupRequest{Filename: "web-01/root.raw", Host: host, Tags: tags, Size: 4096})
		if err != nil {
			t.Fatal(err)
		}
		return res.SnapshotID
	}
	old := put("hv-a", DiskTags("web-01", "root", "1")...)
	put("hv-a", DiskTags("web-01", "root", "2")...)
	otherHost := put("hv-b", DiskTags("web-01", "root", "3")...)
	otherVM := put("hv-a", DiskTags("db-01", "root", "4")...)
	notOurs := put("hv-a", "web-01")

	res, err := r.Forget(ctx, VMScope("hv-a", "web-01"), KeepPolicy{Last: 1}, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Removed) != 1 || res.Removed[0] != old {
		t.Fatalf("removed %v, want only %s", res.Removed, old)
	}
	all, _ := r.Snapshots(ctx, Filter{})
	left := map[string]bool{}
	for _, s := range all {
		left[s.ID] = true
	}
	for _, id := range []string{otherHost, otherVM, notOurs} {
		if !left[id] {
			t.Errorf("snapshot %s outside the scope was forgotten", id)
		}
	}
	if err := r.ForgetSnapshots(ctx, VMScope("hv-a", "web-01"), []string{notOurs}, false); !errors.Is(err, ErrOutOfScope) {
		t.Errorf("forget of a snapshot outside the scope: %v, want ErrOutOfScope", err)
	}
	if _, err := r.Forget(ctx, Scope{Host: "hv-a", Tags: []string{TagVM("web-01")}}, KeepPolicy{Last: 1}, false); !errors.Is(err, ErrOutOfScope) {
		t.Errorf("forget without the gitfleet tag: %v, want ErrOutOfScope", err)
	}
	if _, err := r.Forget(ctx, VMScope("hv-a", "web-01"), KeepPolicy{}, false); !errors.Is(err, ErrConfig) {
		t.Errorf("forget with an empty policy: %v, want ErrConfig", err)
	}
}

func TestCheckReadsDataAndFindsDamage(t *testing.T) {
	r := newRepo(t)
	ctx := context.Background()
	data := randomBytes(t, 1<<20)
	if _, err := r.Backup(ctx, bytes.NewReader(data), diskRequest("web-01", "root", "1", len(data))); err != nil {
		t.Fatal(err)
	}
	if err := r.Check(ctx, "100%"); err != nil {
		t.Fatalf("check of a sound repository: %v", err)
	}
	if err := r.Check(ctx, "1/0; rm -rf /"); !errors.Is(err, ErrConfig) {
		t.Errorf("a bad subset: %v, want ErrConfig", err)
	}
	packs, _ := filepath.Glob(filepath.Join(r.URL, "data", "*", "*"))
	if len(packs) == 0 {
		t.Fatal("no pack files")
	}
	for _, p := range packs {
		b, _ := os.ReadFile(p)
		b[len(b)/2] ^= 0xff
		os.Chmod(p, 0o600)
		os.WriteFile(p, b, 0o600)
	}
	if err := r.Check(ctx, "100%"); !errors.Is(err, ErrDamaged) {
		t.Fatalf("check of a damaged repository: %v, want ErrDamaged", err)
	}
}

func TestDumpOfAMissingSnapshotOrFile(t *testing.T) {
	r := newRepo(t)
	ctx := context.Background()
	if _, err := r.DumpTo(ctx, io.Discard, "0123456789abcdef", "web-01/root.raw"); !errors.Is(err, ErrNotFound) {
		t.Errorf("dump of a missing snapshot: %v, want ErrNotFound", err)
	}
	res, err := r.Backup(ctx, bytes.NewReader([]byte("abc")), diskRequest("web-01", "root", "1", 3))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.DumpTo(ctx, io.Discard, res.SnapshotID, "web-01/data.raw"); err == nil {
		t.Errorf("dump of a missing file succeeded")
	}
}

func TestVersionIsParsed(t *testing.T) {
	needRestic(t)
	r := &Repository{}
	v, err := r.Version(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !v.AtLeast(0, 14, 0) || !strings.HasPrefix(v.Raw, "restic ") {
		t.Fatalf("version %+v", v)
	}
}
