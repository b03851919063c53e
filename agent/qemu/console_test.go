package qemu

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

	"github.com/gitfleet/gitfleet/internal/syncbuf"

	"github.com/gitfleet/gitfleet/agent"
)

func TestSerialLogRotation(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, SerialLog)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

	t.Run("a boot appends its marker on a line of its own", func(t *testing.T) {
		if err := os.WriteFile(log, []byte("first boot, cut mid-line"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := prepareSerialLog(dir, at); err != nil {
			t.Fatal(err)
		}
		want := "first boot, cut mid-line\n--- gitfleet: boot 2026-01-02T03:04:05Z ---\n"
		if got := serial(dir); got != want {
			t.Errorf("log = %q, want %q", got, want)
		}
	})

	t.Run("a boot past the cap starts a new log", func(t *testing.T) {
		big := bytes.Repeat([]byte("x"), int(SerialLogMax)+1)
		if err := os.WriteFile(log, big, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := prepareSerialLog(dir, at); err != nil {
			t.Fatal(err)
		}
		if old, _ := os.ReadFile(filepath.Join(dir, SerialLogOld)); !bytes.Equal(old, big) {
			t.Errorf("%s holds %d bytes, want the %d of the old log", SerialLogOld, len(old), len(big))
		}
		if got := serial(dir); !strings.HasPrefix(got, BootMarker) {
			t.Errorf("new log = %.80q, want it to start with the boot marker", got)
		}
	})

	t.Run("a running log past the cap is copied (its last SerialLogMax bytes) and truncated in place", func(t *testing.T) {
		f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		body := bytes.Repeat([]byte("y"), int(SerialLogMax)+10)
		if err := os.Truncate(log, 0); err != nil {
			t.Fatal(err)
		}
		f.Write(body)
		if err := rotateRunningSerialLog(dir); err != nil {
			t.Fatal(err)
		}
		if old, _ := os.ReadFile(filepath.Join(dir, SerialLogOld)); !bytes.Equal(old, body[10:]) {
			t.Errorf("%s holds %d bytes, want the last %d", SerialLogOld, len(old), SerialLogMax)
		}
		// The writer (QEMU, O_APPEND) goes on at the new end.
		f.WriteString("after\n")
		if got := serial(dir); got != "after\n" {
			t.Errorf("log after rotation = %.80q, want %q", got, "after\n")
		}
		if err := rotateRunningSerialLog(dir); err != nil || serial(dir) != "after\n" {
			t.Errorf("a log under the cap was rotated: %v", err)
		}
	})
}

func TestConsoleScanReadsOnlyTheCurrentBoot(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, SerialLog)
	os.WriteFile(path, []byte("--- gitfleet: boot 2026-01-01T00:00:00Z ---\n"+agent.ConsoleReadyMarker+"\n"), 0o600)
	if err := prepareSerialLog(dir, time.Now()); err != nil {
		t.Fatal(err)
	}
	c := newConsoleScan(path)
	if _, err := c.probe(context.Background()); err == nil {
		t.Fatal("the previous boot's marker made this boot ready")
	}
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(agent.ConsoleReadyMarker + "\n")
	f.Close()
	if _, err := c.probe(context.Background()); err != nil {
		t.Errorf("this boot's marker: %v", err)
	}
	// An agent restarted during the boot scans from the same place.
	if _, err := newConsoleScan(path).probe(context.Background()); err != nil {
		t.Errorf("a fresh scan missed this boot's marker: %v", err)
	}
}

// TestSerialConsoleAcrossRestarts boots the tiny guest twice and attaches
// a console to its serial port: the log keeps both boots, the console
// reaches the guest, and a second console is refused.
func TestSerialConsoleAcrossRestarts(t *testing.T) {
	needQEMU(t)
	t.Parallel()
	srv := newArtifactServer(t)
	spec := guestSpec(t, srv)
	vmRoot := t.TempDir()
	name := "console-01"
	dir := filepath.Join(vmRoot, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	m := agent.Machine{Name: name, Dir: dir, Spec: spec, InstanceID: "i-console-1"}
	p := newTestProvisioner(t, t.TempDir(), vmRoot, srv)
	p.cfg.PowerdownTimeout = 10 * time.Second
	t.Cleanup(func() { p.Destroy(context.Background(), name) })
	ctx := context.Background()
	if err := p.PrepareRootDisk(ctx, m); err != nil {
		t.Fatal(err)
	}
	for boot := 1; boot <= 2; boot++ {
		if boot > 1 {
			if err := p.Shutdown(ctx, name); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.Boot(ctx, m); err != nil {
			t.Fatal(err)
		}
		waitReady(t, p, name)
		waitSerial(t, dir, "tinyguest: ready")
	}
	log := serial(dir)
	if n := strings.Count(log, "tinyguest: init"); n != 2 {
		t.Errorf("serial log holds %d boots' init lines, want both boots':\n%s", n, log)
	}
	if n := strings.Count(log, BootMarker); n != 2 {
		t.Errorf("serial log holds %d boot markers, want 2", n)
	}
	if first, second := strings.Index(log, "tinyguest: power button"), strings.LastIndex(log, BootMarker); first < 0 || first > second {
		t.Errorf("the first boot's shutdown is not before the second boot's marker:\n%s", log)
	}

	in, feed := io.Pipe()
	var out syncbuf.Buffer
	attached := make(chan error, 1)
	go func() { attached <- AttachConsole(ctx, dir, in, &out) }()
	const answer = "tinyguest: console hello-from-the-host"
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(out.String(), answer) {
		if time.Now().After(deadline) {
			t.Fatalf("no answer on the console; it shows:\n%s", out.String())
		}
		// The guest may not read yet: type the line again until it answers.
		feed.Write([]byte("hello-from-the-host\n"))
		time.Sleep(500 * time.Millisecond)
	}
	if err := AttachConsole(ctx, dir, strings.NewReader(""), io.Discard); !errors.Is(err, ErrConsoleBusy) {
		t.Errorf("second console: %v, want ErrConsoleBusy", err)
	}
	waitSerial(t, dir, answer) // the log goes on while a console is attached
	feed.Close()
	select {
	case err := <-attached:
		if err != nil {
			t.Errorf("console ended with %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("console did not detach when its input ended")
	}
	// Detached, the port takes the next console.
	if err := AttachConsole(ctx, dir, strings.NewReader(string([]byte{ConsoleEscape})), io.Discard); err != nil {
		t.Errorf("console after the first detached: %v", err)
	}
}
