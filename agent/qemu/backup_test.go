package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/backup"
	"github.com/gitfleet/gitfleet/desired"
)

// These tests back up a real tiny guest while it writes, into a real
// restic repository, and restore it.

func needBackupTools(t testing.TB) {
	t.Helper()
	needQEMU(t)
	for _, bin := range []string{"restic", nbdcopyBin, qemuNBDBin} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed (scripts/install-deps.sh installs restic, libnbd-bin and qemu-utils)", bin)
		}
	}
}

// testRepo is a fresh local restic repository.
func testRepo(t testing.TB) *backup.Repository {
	t.Helper()
	dir := t.TempDir()
	pw := filepath.Join(dir, "password")
	if err := os.WriteFile(pw, []byte("backup test password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &backup.Repository{URL: filepath.Join(dir, "repo"), PasswordFile: pw, CacheDir: filepath.Join(dir, "cache")}
	if err := r.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return r
}

// writerScript is the tiny guest's user-data: it finds its root disk and
// its volume "data" by virtio serial and writes numbered 4 KiB records
// to both, root first, each synced before the next, from 1 MiB on: at any
// instant the volume holds the root's records or one fewer. It prints
// "wrote N" every 10 records.
const writerScript = `#!/bin/sh
for d in /sys/block/vd*; do
  case "$(cat $d/serial)" in gitfleet-root) root=/dev/${d##*/};; data) vol=/dev/${d##*/};; esac
done
echo "writer root=$root vol=$vol"
i=0
while [ $i -lt 15000 ]; do
  printf 'gitfleet-record %08d\n' $i > /tmp/rec
  dd if=/tmp/rec of=$root bs=4096 seek=$((256+i)) conv=notrunc,sync,fsync 2>/dev/null || { echo "writer failed root $i"; exit; }
  dd if=/tmp/rec of=$vol bs=4096 seek=$((256+i)) conv=notrunc,sync,fsync 2>/dev/null || { echo "writer failed vol $i"; exit; }
  i=$((i+1))
  [ $((i % 10)) -eq 0 ] && echo "wrote $i"
done
echo "writer done"
`

var wroteLine = regexp.MustCompile(`tinyguest: probe wrote ([0-9]+)`)

// written is the last record count the guest reported.
func written(dir string) int {
	m := wroteLine.FindAllStringSubmatch(serial(dir), -1)
	if len(m) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}

func waitWritten(t *testing.T, dir string, n int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for written(dir) < n {
		if time.Now().After(deadline) {
			t.Fatalf("the guest wrote %d records, not %d:\n%s", written(dir), n, serial(dir))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// records counts the guest's records at the start of a disk stream: the
// contiguous run from record 0, and whether any block after it holds a
// record (a view that is no single instant of the guest's sequential
// writes).
func records(t *testing.T, s io.Reader) (n int, gap bool) {
	t.Helper()
	block := make([]byte, 4096)
	if _, err := io.CopyN(io.Discard, s, 256*4096); err != nil {
		t.Fatal(err)
	}
	for k := 0; ; k++ {
		if _, err := io.ReadFull(s, block); err != nil {
			if errors.Is(err, io.EOF) {
				return n, gap
			}
			t.Fatal(err)
		}
		want := fmt.Sprintf("gitfleet-record %08d\n", k)
		switch {
		case !gap && bytes.HasPrefix(block, []byte(want)):
			n++
		case bytes.HasPrefix(block, []byte("gitfleet-record ")):
			gap = true
		case !gap:
			gap = false
			if k > n+1 {
				io.Copy(io.Discard, s)
				return n, gap
			}
		}
		if k > 16000 {
			io.Copy(io.Discard, s)
			return n, gap
		}
	}
}

// writingGuest boots the tiny guest with the writer and a 64 MiB volume
// "data", and waits for its first records.
func writingGuest(t *testing.T, name string) (*Provisioner, agent.Machine, string) {
	t.Helper()
	srv := newArtifactServer(t)
	spec := guestSpec(t, srv)
	spec.CloudInit = &desired.CloudInit{UserData: writerScript}
	vmRoot := t.TempDir()
	dir := filepath.Join(vmRoot, name)
	volDir := filepath.Join(vmRoot, "volumes")
	for _, d := range []string{dir, volDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	vol := filepath.Join(volDir, "data")
	if err := os.WriteFile(vol, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(vol, 64<<20); err != nil {
		t.Fatal(err)
	}
	p := newTestProvisioner(t, t.TempDir(), vmRoot, srv)
	m := agent.Machine{Name: name, Dir: dir, Spec: spec, Volumes: []string{vol}, InstanceID: "i-" + name}
	t.Cleanup(func() { p.Destroy(context.Background(), name) })
	ctx := context.Background()
	if err := p.PrepareRootDisk(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := p.Boot(ctx, m); err != nil {
		t.Fatal(err)
	}
	waitWritten(t, dir, 20)
	return p, m, vmRoot
}

// backUp stores every disk of the held snapshot of vm in repo and returns
// the manifest's disk records.
func backUp(t *testing.T, p *Provisioner, repo *backup.Repository, vm, id string, snap agent.DiskSnapshot) []backup.ManifestDisk {
	t.Helper()
	ctx := context.Background()
	var disks []backup.ManifestDisk
	for _, d := range snap.Disks {
		s, err := p.OpenSnapshotDisk(ctx, vm, d.Name)
		if err != nil {
			t.Fatal(err)
		}
		res, err := repo.Backup(ctx, s, backup.BackupRequest{Filename: backup.DiskFilename(vm, d.Name), Host: "hv-a",
			Tags: backup.DiskTags(vm, d.Name, id), Size: s.Size()})
		s.Close()
		if err != nil {
			t.Fatalf("back up %s: %v", d.Name, err)
		}
		disks = append(disks, backup.ManifestDisk{Name: d.Name, VirtualSize: d.VirtualSize, SnapshotID: res.SnapshotID,
			File: backup.DiskFilename(vm, d.Name), SHA256: s.SHA256()})
	}
	return disks
}

func TestBackupOfARunningGuestRestoresConsistently(t *testing.T) {
	needBackupTools(t)
	t.Parallel()
	p, m, vmRoot := writingGuest(t, "busy")
	repo := testRepo(t)
	ctx := context.Background()

	// No guest agent answers in the tiny guest: asked to freeze, the
	// view is crash-consistent, and says so.
	snap, err := p.SnapshotDisks(ctx, m.Name, agent.SnapshotOptions{Freeze: true, FreezeTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Consistency != backup.ConsistencyCrash || snap.Reason == "" || len(snap.Disks) != 2 || snap.Disks[0] != (agent.DiskInfo{Name: "root", VirtualSize: 1 << 30}) || snap.Disks[1] != (agent.DiskInfo{Name: "data", VirtualSize: 64 << 20}) {
		t.Fatalf("snapshot %+v: want crash consistency with a reason, root (1 GiB) and data (64 MiB)", snap)
	}
	atSnapshot := written(m.Dir)
	disks := backUp(t, p, repo, m.Name, "b1", snap)
	if err := p.ReleaseSnapshot(ctx, m.Name); err != nil {
		t.Fatal(err)
	}
	waitWritten(t, m.Dir, written(m.Dir)+20)
	if written(m.Dir) <= atSnapshot || strings.Contains(serial(m.Dir), "writer failed") {
		t.Fatalf("the guest did not keep writing through the backup:\n%s", serial(m.Dir))
	}
	for _, f := range dirEntries(t, m.Dir) {
		if strings.HasPrefix(f, "backup-") {
			t.Errorf("release left %s", f)
		}
	}
	blocks, err := queryBlock(ctx, p.machines[m.Name].path(QMPSocket))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks {
		if b.Inserted != nil && strings.HasPrefix(b.Inserted.NodeName, "gf-") {
			t.Errorf("device %s still on %s after release", b.Device, b.Inserted.NodeName)
		}
	}

	// Restore as a new VM, then read the restored disks back.
	restored := agent.Machine{Name: "busy-restored", Dir: filepath.Join(vmRoot, "busy-restored"),
		Volumes: []string{filepath.Join(vmRoot, "volumes", "data-restored")}}
	os.MkdirAll(restored.Dir, 0o700)
	counts := map[string]int{}
	for _, d := range disks {
		disk := d.Name
		if disk == "data" {
			disk = "data-restored"
		}
		rc, err := repo.Dump(ctx, d.SnapshotID, d.File)
		if err != nil {
			t.Fatal(err)
		}
		out, err := p.RestoreDisk(ctx, agent.RestoreRequest{Machine: restored, Disk: disk, Size: d.VirtualSize, SHA256: d.SHA256}, rc)
		rc.Close()
		if err != nil {
			t.Fatalf("restore %s: %v", d.Name, err)
		}
		if out.KeptOld != "" {
			t.Errorf("restore of a new disk kept an old one: %+v", out)
		}
		s, err := p.ReadDisk(ctx, restored, disk)
		if err != nil {
			t.Fatal(err)
		}
		n, gap := records(t, s)
		s.Close()
		if s.SHA256() != d.SHA256 {
			t.Errorf("restored %s reads back with sha256 %s, backed up %s", d.Name, s.SHA256(), d.SHA256)
		}
		if gap || n == 0 {
			t.Errorf("restored %s: %d records then a gap %v: not one instant", d.Name, n, gap)
		}
		counts[d.Name] = n
	}
	// One instant for both disks: the volume has the root's records or
	// one fewer (the guest writes root first).
	if v, r := counts["data"], counts["root"]; v != r && v != r-1 {
		t.Fatalf("root has %d records, data %d: the disks were not taken at one instant", r, v)
	}
	t.Logf("backed up at %d records (root %d, data %d); the guest wrote %d by the end", atSnapshot, counts["root"], counts["data"], written(m.Dir))

	// In place: refused over a disk without replace; kept aside with it.
	if err := p.Shutdown(ctx, m.Name); err != nil {
		t.Fatal(err)
	}
	rc, _ := repo.Dump(ctx, disks[1].SnapshotID, disks[1].File)
	_, err = p.RestoreDisk(ctx, agent.RestoreRequest{Machine: m, Disk: "data", Size: disks[1].VirtualSize, SHA256: disks[1].SHA256}, rc)
	rc.Close()
	if !errors.Is(err, agent.ErrDiskExists) {
		t.Fatalf("restore over a disk without replace: %v, want ErrDiskExists", err)
	}
	rc, _ = repo.Dump(ctx, disks[1].SnapshotID, disks[1].File)
	out, err := p.RestoreDisk(ctx, agent.RestoreRequest{Machine: m, Disk: "data", Size: disks[1].VirtualSize, SHA256: disks[1].SHA256, Replace: true}, rc)
	rc.Close()
	if err != nil || out.KeptOld == "" {
		t.Fatalf("restore with replace: %+v, %v", out, err)
	}
	if _, err := os.Stat(out.KeptOld); err != nil {
		t.Fatalf("the replaced disk was not kept: %v", err)
	}
	// A stream that is not the backup's is refused and moves nothing.
	_, err = p.RestoreDisk(ctx, agent.RestoreRequest{Machine: m, Disk: "data", Size: disks[1].VirtualSize, SHA256: disks[1].SHA256, Replace: true},
		io.LimitReader(bytes.NewReader(make([]byte, 64<<20)), 64<<20))
	if !errors.Is(err, agent.ErrRestoreMismatch) {
		t.Fatalf("restore of a wrong stream: %v, want ErrRestoreMismatch", err)
	}
}

// killingReader kills the stream's nbdcopy once after bytes have passed.
type killingReader struct {
	s     *diskStream
	after int64
	n     int64
}

func (k *killingReader) Read(b []byte) (int, error) {
	n, err := k.s.Read(b)
	k.n += int64(n)
	if k.n >= k.after && k.after > 0 {
		k.s.procs[0].Process.Kill()
		k.after = 0
	}
	return n, err
}

const snapshotHelperEnv = "GITFLEET_TEST_SNAPSHOT_HELPER"

// TestHelperSnapshotProcess is an agent that takes a snapshot of a VM and
// then waits to be killed; run on its own it skips.
func TestHelperSnapshotProcess(t *testing.T) {
	raw := os.Getenv(snapshotHelperEnv)
	if raw == "" {
		t.Skip("helper: runs only as the agent process TestSnapshotFaults starts")
	}
	vmRoot, name, _ := strings.Cut(raw, "\n")
	p, err := New(Config{CacheDir: t.TempDir(), Accel: AccelTCG, Logger: quietLog().Logger,
		MachineDir: func(n string) string { return filepath.Join(vmRoot, n) }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.SnapshotDisks(context.Background(), name, agent.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	fmt.Println("snapshot held")
	time.Sleep(10 * time.Minute)
}

func TestSnapshotFaults(t *testing.T) {
	needBackupTools(t)
	t.Parallel()
	p, m, vmRoot := writingGuest(t, "faulty")
	repo := testRepo(t)
	ctx := context.Background()

	t.Run("a producer failing mid-stream counts nothing", func(t *testing.T) {
		if _, err := p.SnapshotDisks(ctx, m.Name, agent.SnapshotOptions{}); err != nil {
			t.Fatal(err)
		}
		defer p.ReleaseSnapshot(ctx, m.Name)
		s, err := p.OpenSnapshotDisk(ctx, m.Name, "root")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		_, err = repo.Backup(ctx, &killingReader{s: s.(*diskStream), after: 8 << 20},
			backup.BackupRequest{Filename: backup.DiskFilename(m.Name, "root"), Host: "hv-a", Tags: backup.DiskTags(m.Name, "root", "killed"), Size: s.Size()})
		if !errors.Is(err, backup.ErrProducer) {
			t.Fatalf("backup of a killed stream: %v, want ErrProducer", err)
		}
		snaps, err := repo.Snapshots(ctx, backup.Filter{Tags: []string{backup.TagBackup("killed")}})
		if err != nil || len(snaps) != 0 {
			t.Fatalf("snapshots of the killed stream: %v %+v, want none", err, snaps)
		}
	})

	t.Run("an agent killed holding a snapshot is swept at the next start", func(t *testing.T) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperSnapshotProcess$", "-test.v")
		cmd.Env = append(os.Environ(), snapshotHelperEnv+"="+vmRoot+"\n"+m.Name)
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		held := make(chan bool, 1)
		go func() {
			b := make([]byte, 64<<10)
			var got []byte
			for {
				n, err := out.Read(b)
				got = append(got, b[:n]...)
				if bytes.Contains(got, []byte("snapshot held")) {
					held <- true
					io.Copy(io.Discard, out)
					return
				}
				if err != nil {
					t.Logf("helper said: %s", got)
					held <- false
					return
				}
			}
		}()
		if !<-held {
			t.Fatal("the helper agent took no snapshot")
		}
		cmd.Process.Kill() // kill -9, mid-backup
		cmd.Wait()
		if _, err := os.Stat(filepath.Join(m.Dir, SnapshotMarker)); err != nil {
			t.Fatalf("the killed agent left no marker: %v", err)
		}
		before := written(m.Dir)
		p2 := newTestProvisioner(t, t.TempDir(), vmRoot, nil)
		p2.Running(m.Name) // the restarted agent's first look at the VM
		deadline := time.Now().Add(time.Minute)
		for {
			left := 0
			for _, f := range dirEntries(t, m.Dir) {
				if strings.HasPrefix(f, "backup-") {
					left++
				}
			}
			if left == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the sweep left %v", dirEntries(t, m.Dir))
			}
			time.Sleep(100 * time.Millisecond)
		}
		sock := filepath.Join(m.Dir, QMPSocket)
		blocks, err := queryBlock(ctx, sock)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range blocks {
			if b.Inserted != nil && strings.HasPrefix(b.Inserted.NodeName, "gf-") {
				t.Errorf("device %s still on %s after the sweep", b.Device, b.Inserted.NodeName)
			}
		}
		if have, _ := namedNodes(ctx, sock); len(have) > 0 {
			for n := range have {
				if strings.HasPrefix(n, "gf-") {
					t.Errorf("node %s left after the sweep", n)
				}
			}
		}
		if status, err := qmpStatus(ctx, sock); err != nil || status != "running" {
			t.Errorf("after the sweep the VM is %q (%v), want running", status, err)
		}
		waitWritten(t, m.Dir, before+10)
		// And a new snapshot works.
		if _, err := p.SnapshotDisks(ctx, m.Name, agent.SnapshotOptions{}); err != nil {
			t.Fatalf("snapshot after the sweep: %v", err)
		}
		if err := p.ReleaseSnapshot(ctx, m.Name); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("the fleecing space check refuses", func(t *testing.T) {
		// A root disk larger than the free space of the VM's directory.
		var fs syscall.Statfs_t
		if err := syscall.Statfs(m.Dir, &fs); err != nil {
			t.Fatal(err)
		}
		huge := m
		huge.Spec.DiskGB = int(int64(fs.Bavail)*fs.Bsize/(1<<30)) + 2
		if err := p.PrepareRootDisk(ctx, huge); err != nil {
			t.Fatal(err)
		}
		_, err := p.SnapshotDisks(ctx, m.Name, agent.SnapshotOptions{})
		if !errors.Is(err, agent.ErrNoFleeceSpace) {
			t.Fatalf("snapshot of a disk larger than the free space: %v, want ErrNoFleeceSpace", err)
		}
		for _, f := range dirEntries(t, m.Dir) {
			if strings.HasPrefix(f, "backup-") {
				t.Errorf("a refused snapshot left %s", f)
			}
		}
		if !p.Running(m.Name) || strings.Contains(serial(m.Dir), "writer failed") {
			t.Errorf("the guest suffered from a refused snapshot")
		}
	})
}
