package backup

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/testsupport/netnstest"
	"github.com/gitfleet/gitfleet/testsupport/resticserver"
)

// The sftp and REST repositories live on real servers (OpenSSH's sshd,
// rclone's REST server) in a network namespace the test makes, reached
// only at the namespace's own address.

const nsAddr = "198.51.100.1"

// roundTrip backs up a stream, lists it and dumps it back.
func roundTrip(t *testing.T, r *Repository) {
	t.Helper()
	ctx := context.Background()
	if err := r.Init(ctx); err != nil {
		t.Fatal(err)
	}
	data := randomBytes(t, 2<<20)
	res, err := r.Backup(ctx, bytes.NewReader(data), diskRequest("web-01", "root", "r1", len(data)))
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := r.Snapshots(ctx, Filter{Host: "hv-a", Tags: []string{TagBackup("r1")}})
	if err != nil || len(snaps) != 1 || snaps[0].ID != res.SnapshotID {
		t.Fatalf("snapshots %+v, %v", snaps, err)
	}
	var out bytes.Buffer
	if _, err := r.DumpTo(ctx, &out, res.SnapshotID, DiskFilename("web-01", "root")); err != nil || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("dump: %v (equal %v)", err, bytes.Equal(out.Bytes(), data))
	}
}

// cmdlinesWith lists the command lines of running processes that contain
// secret.
func cmdlinesWith(secret string) []string {
	var found []string
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range dirs {
		b, _ := os.ReadFile(f)
		if bytes.Contains(b, []byte(secret)) {
			found = append(found, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return found
}

func TestSFTPRepository(t *testing.T) {
	needRestic(t)
	if !netnstest.Enter(t) {
		return
	}
	resticserver.AddAddress(t, "gfbk0", nsAddr+"/24")
	srv := resticserver.StartSFTP(t, nsAddr)
	dir := t.TempDir()
	r := &Repository{URL: srv.URL("repo"), PasswordFile: writeSecret(t, dir, "password", testPassword),
		SSHKey: srv.KeyFile, KnownHosts: srv.KnownHostsFile, CacheDir: filepath.Join(dir, "cache"), Timeout: 20 * time.Second}
	roundTrip(t, r)
	ctx := context.Background()

	for _, tc := range []struct {
		name string
		edit func(*Repository)
	}{
		{"nothing listens", func(r *Repository) { r.URL = strings.Replace(r.URL, ":"+srv.Port+"/", ":1/", 1) }},
		{"packets vanish", func(r *Repository) { r.URL = strings.Replace(r.URL, nsAddr, "198.51.100.9", 1) }},
		{"another host key", func(r *Repository) {
			other := resticserver.StartSFTP(t, nsAddr)
			r.KnownHosts = other.KnownHostsFile
			r.URL = strings.Replace(r.URL, ":"+srv.Port+"/", ":"+other.Port+"/", 1)
			kh, _ := os.ReadFile(srv.KnownHostsFile)
			os.WriteFile(r.KnownHosts, bytes.Replace(kh, []byte(srv.Port), []byte(other.Port), 1), 0o600)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := r.clone()
			bad.Timeout = 10 * time.Second
			tc.edit(bad)
			start := time.Now()
			_, err := bad.Snapshots(ctx, Filter{})
			if !errors.Is(err, ErrUnreachable) && !errors.Is(err, ErrTimeout) {
				t.Fatalf("err %v, want ErrUnreachable", err)
			}
			if took := time.Since(start); took > bad.Timeout+interruptGrace+5*time.Second {
				t.Errorf("took %s, bound %s", took, bad.Timeout)
			}
			t.Logf("%s after %s", err, time.Since(start).Round(time.Millisecond))
		})
	}
}

func TestRESTRepositoryWithCredentialsFromTheEnvironmentFile(t *testing.T) {
	needRestic(t)
	if !netnstest.Enter(t) {
		return
	}
	resticserver.AddAddress(t, "gfbk0", nsAddr+"/24")
	srv := resticserver.StartREST(t, nsAddr)
	dir := t.TempDir()
	env := writeSecret(t, dir, "restic.env", "# rest server\nRESTIC_REST_USERNAME="+srv.User+"\nRESTIC_REST_PASSWORD=\""+srv.Password+"\"\n")
	r := &Repository{URL: srv.URL("repo"), PasswordFile: writeSecret(t, dir, "password", testPassword),
		EnvironmentFile: env, CacheDir: filepath.Join(dir, "cache"), Timeout: 20 * time.Second}
	if err := CheckURL(r.URL); err != nil {
		t.Fatal(err)
	}
	// While a backup runs, no process's command line holds a secret.
	ctx := context.Background()
	if err := r.Init(ctx); err != nil {
		t.Fatal(err)
	}
	var leaked []string
	probe := &probeReader{data: randomBytes(t, 4<<20), at: 2 << 20, probe: func() {
		leaked = append(cmdlinesWith(srv.Password), cmdlinesWith(testPassword)...)
	}}
	if _, err := r.Backup(ctx, probe, diskRequest("web-01", "root", "r1", 4<<20)); err != nil {
		t.Fatal(err)
	}
	if !probe.probed || len(leaked) > 0 {
		t.Fatalf("probed %v; secrets on command lines: %q", probe.probed, leaked)
	}
	if left, _ := filepath.Glob(filepath.Join(r.CacheDir, ".repository-*")); len(left) > 0 {
		t.Errorf("credential files left in the cache: %v", left)
	}
	wrong := r.clone()
	wrong.EnvironmentFile = writeSecret(t, dir, "wrong.env", "RESTIC_REST_USERNAME="+srv.User+"\nRESTIC_REST_PASSWORD=not-"+srv.Password+"\n")
	_, err := wrong.Snapshots(ctx, Filter{})
	if err == nil || strings.Contains(err.Error(), srv.Password) {
		t.Fatalf("wrong REST password: %v (must fail and quote no credential)", err)
	}
	t.Logf("wrong REST password: %v", err)
}

// probeReader yields data and calls probe once at offset at.
type probeReader struct {
	data   []byte
	at     int
	off    int
	probe  func()
	probed bool
}

func (p *probeReader) Read(b []byte) (int, error) {
	if p.off >= len(p.data) {
		return 0, io.EOF
	}
	if !p.probed && p.off >= p.at {
		time.Sleep(300 * time.Millisecond)
		p.probe()
		p.probed = true
	}
	n := copy(b, p.data[p.off:min(len(p.data), p.off+64<<10)])
	p.off += n
	return n, nil
}
