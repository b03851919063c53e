package qemu

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
)

// listen serves each connection on 127.0.0.1 with serve and returns the
// address.
func listen(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); serve(c) }()
		}
	}()
	return l.Addr().String()
}

func TestSSHBanner(t *testing.T) {
	tests := []struct {
		name  string
		serve func(net.Conn)
		ok    bool
	}{
		// QEMU's user-mode forward accepts before the guest listens, then
		// closes: that is no answer.
		{"forward with nothing behind it", func(net.Conn) {}, false},
		{"sshd", func(c net.Conn) { c.Write([]byte("SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n")) }, true},
		{"lines before the banner", func(c net.Conn) { c.Write([]byte("welcome\r\nSSH-2.0-x\r\n")) }, true},
		{"another protocol", func(c net.Conn) { c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n")) }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := sshBanner(context.Background(), listen(t, tc.serve))
			if (err == nil) != tc.ok {
				t.Errorf("sshBanner: %v, want ok=%v", err, tc.ok)
			}
		})
	}
	t.Run("silent server is bounded by the context", func(t *testing.T) {
		addr := listen(t, func(net.Conn) { time.Sleep(time.Minute) })
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		if err := sshBanner(ctx, addr); err == nil {
			t.Error("a server that never speaks counted as sshd")
		}
	})
}

func TestConsoleScan(t *testing.T) {
	path := filepath.Join(t.TempDir(), SerialLog)
	c := newConsoleScan(path)
	write := func(s string, flag int) {
		t.Helper()
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|flag, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(s)
		f.Close()
	}
	found := func() bool { _, err := c.probe(context.Background()); return err == nil }
	if found() {
		t.Fatal("marker found in a missing log")
	}
	// The kernel echoes its command line and a guest may mention the
	// marker: only the marker alone on its line counts.
	write("[    0.000000] Command line: console=ttyS0 GITFLEET-GUEST-READY\r\nsay GITFLEET-GUEST-READY later\r\nGITFLEET-GUEST-", os.O_APPEND)
	if found() {
		t.Fatal("marker found inside other lines, or before its line ended")
	}
	write("READY\r\n", os.O_APPEND)
	if !found() {
		t.Fatal("marker split across two reads not found")
	}
	// QEMU truncates the log when it starts the VM again.
	c = newConsoleScan(path)
	write("boot\n", os.O_APPEND)
	found()
	write("x\n", os.O_TRUNC)
	if found() {
		t.Fatal("marker of an earlier boot found after the log was truncated")
	}
	write(agent.ConsoleReadyMarker+"\n", os.O_APPEND)
	if !found() {
		t.Fatal("marker after truncation not found")
	}
}

func TestReadyFileNamesItsBoot(t *testing.T) {
	path := filepath.Join(t.TempDir(), ReadyFile)
	at := time.Unix(1767000000, 123456789)
	if err := writeReadyFile(path, 4242, agent.Readiness{Ready: true, At: at, Via: agent.ReadySSH, Addr: "127.0.0.1:2201"}); err != nil {
		t.Fatal(err)
	}
	r, ok := readReadyFile(path, 4242)
	if !ok || !r.Ready || !r.At.Equal(at) || r.Via != agent.ReadySSH || r.Addr != "127.0.0.1:2201" {
		t.Errorf("read back %+v %v", r, ok)
	}
	if _, ok := readReadyFile(path, 4243); ok {
		t.Error("the answer of QEMU pid 4242 counted for pid 4243")
	}
	// A refusal since the answer is recorded too; a guest that answers
	// another way has no address.
	refused := at.Add(time.Minute)
	if err := writeReadyFile(path, 4242, agent.Readiness{At: at, Via: agent.ReadySSH, Addr: "127.0.0.1:2201", Refused: refused}); err != nil {
		t.Fatal(err)
	}
	if r, ok := readReadyFile(path, 4242); !ok || r.Ready || !r.Refused.Equal(refused) || !r.At.Equal(at) || r.Addr != "127.0.0.1:2201" {
		t.Errorf("read back a refusal as %+v %v", r, ok)
	}
	if err := writeReadyFile(path, 4242, agent.Readiness{Ready: true, At: at, Via: agent.ReadyConsole}); err != nil {
		t.Fatal(err)
	}
	if r, ok := readReadyFile(path, 4242); !ok || !r.Ready || r.Addr != "" || r.Via != agent.ReadyConsole {
		t.Errorf("read back a console answer as %+v %v", r, ok)
	}
	// A file of the earlier four-field form reads as ready.
	if err := os.WriteFile(path, []byte("4242 ssh 1767000000123456789 127.0.0.1:2201\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r, ok := readReadyFile(path, 4242); !ok || !r.Ready || r.Addr != "127.0.0.1:2201" {
		t.Errorf("read back an earlier file as %+v %v", r, ok)
	}
}

// switchable serves, on 127.0.0.1, what its mode says: an SSH banner,
// nothing but a close (QEMU's forward with no sshd behind it), or silence.
type switchable struct {
	mode  atomic.Value // "banner", "close" or "silent"
	conns atomic.Int64
}

func (s *switchable) serve(c net.Conn) {
	s.conns.Add(1)
	switch s.mode.Load() {
	case "banner":
		c.Write([]byte("SSH-2.0-OpenSSH_9.2p1\r\n"))
	case "silent":
		time.Sleep(2 * time.Second)
	case "drop-one":
		// sshd past its MaxStartups drops one connection; the next one
		// gets the banner.
		s.mode.Store("banner")
	}
}

// TestSSHReadinessFollowsTheBanner pins the readiness of a guest given SSH
// keys: ready once its banner is read, still ready when one connection is
// dropped (sshd past its MaxStartups), not ready (and not saved as ready)
// once its sshd refuses twice in a row, unchanged by a probe that only timed out,
// and ready again, with its first answer kept, when sshd answers again.
func TestSSHReadinessFollowsTheBanner(t *testing.T) {
	s := &switchable{}
	s.mode.Store("close")
	addr := listen(t, s.serve)
	readyFile := filepath.Join(t.TempDir(), ReadyFile)
	w := &bootWatch{pid: 4242, recheck: 20 * time.Millisecond, recheckLate: 20 * time.Millisecond}
	w.r.Booted, w.r.SSHRequired = time.Now(), true
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	t.Cleanup(cancel)
	probe := func(ctx context.Context) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		return addr, sshBanner(ctx, addr)
	}
	logger, logs := logtest.NewNullLogger()
	go w.sshLoop(ctx, probe, readyFile, logger.WithField("vm", "web-01"))

	waitFor := func(what string, cond func(agent.Readiness) bool) agent.Readiness {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			r := w.readiness()
			if cond(r) {
				return r
			}
			if time.Now().After(deadline) {
				t.Fatalf("never %s: %+v", what, r)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	conns := func(n int64) func(agent.Readiness) bool {
		from := s.conns.Load()
		return func(agent.Readiness) bool { return s.conns.Load() >= from+n }
	}
	savedReady := func() bool { r, ok := readReadyFile(readyFile, 4242); return ok && r.Ready }

	if r := waitFor("probed thrice", conns(3)); r.Ready {
		t.Fatalf("a forward that accepts and closes made the guest ready: %+v", r)
	}
	s.mode.Store("banner")
	first := waitFor("ready", func(r agent.Readiness) bool { return r.Ready })
	if first.Via != agent.ReadySSH || first.Addr != addr || first.At.IsZero() || !savedReady() {
		t.Errorf("first answer %+v, saved %v", first, savedReady())
	}

	s.mode.Store("drop-one")
	waitFor("probed past the dropped connection", conns(2))
	for _, e := range logs.AllEntries() {
		if strings.Contains(e.Message, "refuses") {
			t.Errorf("one dropped connection made the guest count as refusing: %s", e.Message)
		}
	}

	s.mode.Store("close")
	r := waitFor("not ready", func(r agent.Readiness) bool { return !r.Ready })
	if r.Refused.IsZero() || savedReady() {
		t.Errorf("after a refusal: %+v, saved as ready %v", r, savedReady())
	}

	// An agent restarted now finds the refusal, not a guest that never
	// answered: its first answer, where, and since when sshd refuses.
	restored := restoreReadiness(readyFile, 4242, agent.Readiness{Booted: w.r.Booted, SSHRequired: true})
	if restored.Ready || !restored.Refused.Equal(r.Refused) || !restored.At.Equal(first.At) || restored.Addr != addr || !restored.SSHRequired {
		t.Errorf("restored after a refusal: %+v; want the refusal at %v of the answer at %v kept", restored, r.Refused, first.At)
	}

	s.mode.Store("banner")
	waitFor("ready again", func(r agent.Readiness) bool { return r.Ready })
	s.mode.Store("silent")
	r = waitFor("probed twice in silence", conns(2))
	if !r.Ready {
		t.Errorf("a probe that timed out made the guest not ready: %+v", r)
	}
	if !r.At.Equal(first.At) || !r.Refused.IsZero() || !savedReady() {
		t.Errorf("ready again: %+v; want its first answer at %v kept and saved", r, first.At)
	}
}

func TestSeedGivesSSHKeys(t *testing.T) {
	for _, tc := range []struct {
		name string
		ci   *desired.CloudInit
		want bool
	}{
		{"no cloudInit", nil, false},
		{"user-data only", &desired.CloudInit{UserData: "#cloud-config\n"}, false},
		{"keys", &desired.CloudInit{SSHAuthorizedKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAItest a@b"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files, err := seedFiles("web-01", "i-1", macFor("web-01"), tc.ci, nil)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), SeedFile)
			if err := writeSeedISO(path, files); err != nil {
				t.Fatal(err)
			}
			got, err := seedGivesSSHKeys(path)
			if err != nil || got != tc.want {
				t.Errorf("seedGivesSSHKeys = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
	if _, err := seedGivesSSHKeys(filepath.Join(t.TempDir(), "none.iso")); err == nil {
		t.Error("a missing seed read as one")
	}
}
