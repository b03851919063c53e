package qemu

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/backup"
)

// BenchmarkBackupRestore10G backs up the 10 GiB root disk (1 GiB of it
// written, random) of a running tiny guest and reports, run with
// -benchtime=1x:
//
//	backup-ratio   throughput of SnapshotDisks+stream+restic as a share
//	               of `restic backup --stdin` of the same raw file
//	second-added-% what a second backup added to the repository after 1%
//	               of the disk changed, in % of the disk (target <= 2)
//	restore-ratio  throughput of Dump+RestoreDisk as a share of
//	               `restic dump` to /dev/null
//
// It needs about 5 GiB free in the temporary directory and skips
// without.
func BenchmarkBackupRestore10G(b *testing.B) {
	needBackupTools(b)
	const size, written, chunk = 10 << 30, 1 << 30, 16 << 20
	work := b.TempDir()
	var fs syscall.Statfs_t
	if err := syscall.Statfs(work, &fs); err != nil || int64(fs.Bavail)*fs.Bsize < 5<<30 {
		b.Skipf("needs 5 GiB free in %s", work)
	}
	ctx := context.Background()
	raw := filepath.Join(work, "disk.raw")
	writeSpread(b, raw, size, written, chunk)

	srv := newArtifactServer(b)
	spec := guestSpec(b, srv)
	spec.DiskGB = 10
	vmRoot := filepath.Join(work, "vms")
	m := agent.Machine{Name: "bench", Dir: filepath.Join(vmRoot, "bench"), Spec: spec, InstanceID: "i-bench"}
	os.MkdirAll(m.Dir, 0o700)
	benchRun(b, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, filepath.Join(m.Dir, RootDiskFile))
	p := newTestProvisioner(b, filepath.Join(work, "cache"), vmRoot, srv)
	b.Cleanup(func() { p.Destroy(context.Background(), m.Name) })
	if err := p.Boot(ctx, m); err != nil {
		b.Fatal(err)
	}

	base := testRepo(b)
	start := time.Now()
	resticStdin(b, base, raw)
	tBase := time.Since(start)

	repo := testRepo(b)
	start = time.Now()
	first := benchBackup(b, p, repo, m.Name, "1")
	tOurs := time.Since(start)

	// 1% of the disk changes, in place, through QEMU's own I/O path.
	change := filepath.Join(m.Dir, "change.bin")
	writeRandom(b, change, size/100)
	hmp(b, p, m.Name, fmt.Sprintf(`qemu-io root "write -s change.bin %d %d"`, int64(size/3), int64(size/100)))
	os.Remove(change)
	second := benchBackup(b, p, repo, m.Name, "2")

	if err := p.Shutdown(ctx, m.Name); err != nil {
		b.Fatal(err)
	}
	start = time.Now()
	if _, err := repo.DumpTo(ctx, io.Discard, first.SnapshotID, backup.DiskFilename(m.Name, "root")); err != nil {
		b.Fatal(err)
	}
	tDump := time.Since(start)
	restored := agent.Machine{Name: "bench-restored", Dir: filepath.Join(vmRoot, "bench-restored")}
	os.MkdirAll(restored.Dir, 0o700)
	start = time.Now()
	rc, err := repo.Dump(ctx, first.SnapshotID, backup.DiskFilename(m.Name, "root"))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := p.RestoreDisk(ctx, agent.RestoreRequest{Machine: restored, Disk: "root", Size: size, SHA256: first.sum}, rc); err != nil {
		b.Fatal(err)
	}
	rc.Close()
	tRestore := time.Since(start)

	b.ReportMetric(tBase.Seconds()/tOurs.Seconds(), "backup-ratio")
	b.ReportMetric(100*float64(second.BytesAdded)/float64(size), "second-added-%")
	b.ReportMetric(tDump.Seconds()/tRestore.Seconds(), "restore-ratio")
	b.Logf("restic --stdin %s, ours %s; second backup added %d bytes; restic dump %s, dump+restore %s",
		tBase.Round(time.Millisecond), tOurs.Round(time.Millisecond), second.BytesAdded, tDump.Round(time.Millisecond), tRestore.Round(time.Millisecond))
}

type benchResult struct {
	backup.BackupResult
	sum string
}

func benchBackup(b *testing.B, p *Provisioner, repo *backup.Repository, vm, id string) benchResult {
	b.Helper()
	ctx := context.Background()
	if _, err := p.SnapshotDisks(ctx, vm, agent.SnapshotOptions{}); err != nil {
		b.Fatal(err)
	}
	defer p.ReleaseSnapshot(ctx, vm)
	s, err := p.OpenSnapshotDisk(ctx, vm, "root")
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	res, err := repo.Backup(ctx, s, backup.BackupRequest{Filename: backup.DiskFilename(vm, "root"), Host: "hv-a", Tags: backup.DiskTags(vm, "root", id), Size: s.Size()})
	if err != nil {
		b.Fatal(err)
	}
	return benchResult{res, s.SHA256()}
}

// writeSpread makes a sparse raw file of size bytes with written bytes of
// random data in chunks spread evenly over it.
func writeSpread(b *testing.B, path string, size, written, chunk int64) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, chunk)
	n := written / chunk
	for i := int64(0); i < n; i++ {
		rand.Read(buf)
		if _, err := f.WriteAt(buf, i*(size/n)); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Truncate(size); err != nil {
		b.Fatal(err)
	}
}

func writeRandom(b *testing.B, path string, n int64) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if _, err := io.CopyN(f, rand.Reader, n); err != nil {
		b.Fatal(err)
	}
	os.Chmod(path, 0o644)
}

// resticStdin is the baseline: restic backup --stdin of the raw file.
func resticStdin(b *testing.B, r *backup.Repository, raw string) {
	f, err := os.Open(raw)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command("restic", "-r", r.URL, "--cache-dir", r.CacheDir, "backup", "--stdin", "--stdin-filename", "bench/root.raw", "--host", "hv-a")
	cmd.Env = append(os.Environ(), "RESTIC_PASSWORD_FILE="+r.PasswordFile)
	cmd.Stdin = f
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("restic backup --stdin: %v: %s", err, out)
	}
}

// hmp runs a human monitor command on the VM's QEMU and fails on any
// output (qemu-io prints only errors and timings).
func hmp(b *testing.B, p *Provisioner, vm, line string) {
	ret, err := qmpCommand(context.Background(), p.machines[vm].path(QMPSocket), "human-monitor-command", map[string]any{"command-line": line})
	if err != nil {
		b.Fatal(err)
	}
	var out string
	json.Unmarshal(ret, &out)
	b.Logf("hmp %s: %s", line, out)
}

func benchRun(b *testing.B, name string, args ...string) {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		b.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}
