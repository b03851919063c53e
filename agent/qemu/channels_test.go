package qemu

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
)

// Every read the agent makes from a channel a guest or QEMU writes to is
// bounded in bytes and in time: a peer that sends without end, or never
// answers, costs a bounded amount of memory and time and an error that
// says which bound it hit.

// zeros is a chunk of what a hostile peer streams: no newline, no 0xFF.
var zeros = make([]byte, 64<<10)

// floodBytes is how much a hostile peer in these tests sends before it
// falls silent: far more than any bound of the agent, and little enough
// that an agent without one survives the test.
const floodBytes = 64 << 20

// flood writes chunk to c until floodBytes are sent or the write fails
// (the client left), then holds the connection open and silent.
func flood(c net.Conn, chunk []byte) {
	for sent := 0; sent < floodBytes; sent += len(chunk) {
		if _, err := c.Write(chunk); err != nil {
			return
		}
	}
	io.Copy(io.Discard, c) // until the client leaves
}

// letters is a chunk of a JSON string that never ends.
var letters = bytes.Repeat([]byte("a"), 64<<10)

// allocated runs f and returns the bytes it allocated on the heap.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// within runs f and fails the test when it has not returned after limit,
// which only bounds a broken run (the calls under test are bounded far
// below it).
func within(t *testing.T, limit time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(limit):
		t.Fatalf("%s: still running after %s", what, limit)
	}
}

func TestQGACallBoundsWhatItReads(t *testing.T) {
	for _, tc := range []struct {
		name  string
		serve func(r *bufio.Reader, c net.Conn)
	}{
		{"bytes without a 0xFF or a newline", func(r *bufio.Reader, c net.Conn) { flood(c, zeros) }},
		{"0xFF bytes without a newline", func(r *bufio.Reader, c net.Conn) { flood(c, bytes.Repeat([]byte{0xff}, 64<<10)) }},
		{"short lines that never sync", func(r *bufio.Reader, c net.Conn) {
			flood(c, bytes.Repeat([]byte("\xff{\"return\": 1}\n"), 4<<10))
		}},
		{"a reply without end after the sync", func(r *bufio.Reader, c net.Conn) {
			syncReply(r, c)
			r.ReadBytes('\n')
			c.Write([]byte(`{"return": "`))
			flood(c, letters)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := fakeQGA(t, tc.serve)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var err error
			n := allocated(func() {
				within(t, time.Minute, "guest-ping", func() { err = qgaCall(ctx, sock, "guest-ping", nil, nil) })
			})
			if !errors.Is(err, ErrReplyTooLong) {
				t.Fatalf("guest-ping: %v, want %v; %d KiB allocated", err, ErrReplyTooLong, n>>10)
			}
			t.Logf("%v; %d KiB allocated", err, n>>10)
		})
	}
}

// syncReply reads a guest-sync-delimited request and answers it as
// qemu-ga does.
func syncReply(r *bufio.Reader, c net.Conn) {
	b, _ := r.ReadBytes('\n')
	var req struct {
		Arguments struct{ ID int64 } `json:"arguments"`
	}
	json.Unmarshal(bytes.TrimLeft(b, "\xff"), &req)
	fmt.Fprintf(c, "\xff{\"return\": %d}\n", req.Arguments.ID)
}

// fakeQMP accepts one connection on a unix socket and runs serve on it.
func fakeQMP(t *testing.T, serve func(r *bufio.Reader, c net.Conn)) string {
	t.Helper()
	return fakeQGA(t, serve) // the same listener; only the name differs
}

const qmpGreeting = `{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}}, "capabilities": []}}` + "\n"

func TestQMPCommandBoundsWhatItReads(t *testing.T) {
	for _, tc := range []struct {
		name  string
		serve func(r *bufio.Reader, c net.Conn)
	}{
		{"a greeting without end", func(r *bufio.Reader, c net.Conn) {
			c.Write([]byte(`{"QMP": "`))
			flood(c, letters)
		}},
		{"events without end", func(r *bufio.Reader, c net.Conn) {
			c.Write([]byte(qmpGreeting))
			r.ReadBytes('\n')
			c.Write([]byte(`{"return": {}}` + "\n"))
			r.ReadBytes('\n')
			flood(c, bytes.Repeat([]byte(`{"event": "RTC_CHANGE", "data": {"offset": 1}}`+"\n"), 1<<10))
		}},
		{"a reply without end", func(r *bufio.Reader, c net.Conn) {
			c.Write([]byte(qmpGreeting))
			r.ReadBytes('\n')
			c.Write([]byte(`{"return": {}}` + "\n"))
			r.ReadBytes('\n')
			c.Write([]byte(`{"return": {"status": "`))
			flood(c, letters)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := fakeQMP(t, tc.serve)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var err error
			n := allocated(func() {
				within(t, time.Minute, "query-status", func() { _, err = qmpStatus(ctx, sock) })
			})
			if !errors.Is(err, ErrReplyTooLong) {
				t.Fatalf("query-status: %v, want %v; %d KiB allocated", err, ErrReplyTooLong, n>>10)
			}
			t.Logf("%v; %d KiB allocated", err, n>>10)
		})
	}
}

// A QEMU that accepts QMP connections and never answers (hung, or
// compromised) holds a command for channelTimeout at most, whatever the
// caller's deadline: a stop's ladder goes on to the signals.
func TestQMPCommandOfASilentQEMUIsBounded(t *testing.T) {
	t.Parallel()
	sock := fakeQMP(t, func(r *bufio.Reader, c net.Conn) { time.Sleep(time.Hour) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	var err error
	within(t, 3*channelTimeout, "system_powerdown", func() { _, err = qmpCommand(ctx, sock, "system_powerdown", nil) })
	if err == nil {
		t.Fatal("a silent QEMU answered")
	}
}

func TestQGACallOfASilentGuestIsBounded(t *testing.T) {
	t.Parallel()
	sock := fakeQGA(t, func(r *bufio.Reader, c net.Conn) { time.Sleep(time.Hour) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	var err error
	within(t, 3*channelTimeout, "guest-ping", func() { err = qgaCall(ctx, sock, "guest-ping", nil, nil) })
	if err == nil {
		t.Fatal("a silent guest agent answered")
	}
}

func TestSSHBannerBoundsWhatItReads(t *testing.T) {
	for _, tc := range []struct {
		name  string
		serve func(c net.Conn)
	}{
		{"a line without end", func(c net.Conn) { flood(c, zeros) }},
		{"a long line, then a banner", func(c net.Conn) {
			c.Write(bytes.Repeat([]byte("x"), 300))
			c.Write([]byte("\r\nSSH-2.0-OpenSSH_9.2\r\n"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			go func() {
				c, err := l.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				tc.serve(c)
			}()
			var berr error
			n := allocated(func() {
				within(t, time.Minute, "ssh banner", func() { berr = sshBanner(context.Background(), l.Addr().String()) })
			})
			if !errors.Is(berr, ErrReplyTooLong) {
				t.Fatalf("ssh banner: %v, want %v (RFC 4253 4.2: at most 255 bytes a line); %d KiB allocated", berr, ErrReplyTooLong, n>>10)
			}
			t.Logf("%v; %d KiB allocated", berr, n>>10)
		})
	}
}

// QEMU writes its own output to qemu.log, as much as it likes: the agent
// reads only its tail.
func TestFailureReasonReadsOnlyTheTail(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, QEMULog)
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1024; i++ {
		f.Write(zeros) // 64 MiB
	}
	f.WriteString("\nqemu-system-x86_64: the last word\n")
	f.Close()
	p, err := New(Config{CacheDir: t.TempDir(), Accel: AccelTCG, Logger: quietLog().Logger,
		MachineDir: func(string) string { return dir }})
	if err != nil {
		t.Fatal(err)
	}
	var reason string
	n := allocated(func() { reason = p.FailureReason("vm") })
	if reason != "qemu-system-x86_64: the last word" {
		t.Errorf("FailureReason = %.80q", reason)
	}
	if n > 1<<20 {
		t.Errorf("FailureReason of a 64 MiB qemu.log allocated %d MiB: it reads the whole log", n>>20)
	}
}

// floodScript is the user-data of a hostile guest: it streams bytes
// without a newline (floodBytes at a time) into its guest agent's port and
// to whoever connects to its SSH port.
const floodScript = `#!/bin/sh
for p in /sys/class/virtio-ports/*; do
	[ "$(cat "$p/name")" = ` + QGAChannel + ` ] && port=/dev/${p##*/}
done
echo "qga port $port"
( while :; do head -c 67108864 /dev/zero > "$port"; sleep 1; done ) &
( while :; do head -c 67108864 /dev/zero | nc -l -p 22; done ) &
echo flooding
`

// A real hostile guest (the tiny guest, under TCG) floods its guest agent
// channel and its SSH port: the guest agent call and the SSH banner read
// stop at their bound, with an error that says so.
func TestHostileGuestFloodsItsChannels(t *testing.T) {
	needQEMU(t)
	t.Parallel()
	p, m, _ := bootScripted(t, "flood", floodScript)
	name := m.Name
	ctx := context.Background()
	s := waitSerial(t, m.Dir, "probe flooding")
	if !strings.Contains(s, "probe qga port /dev/vport") {
		t.Fatalf("the guest found no guest agent port:\n%s", strings.Join(guestLines(s), "\n"))
	}

	t.Run("guest agent", func(t *testing.T) {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		var err error
		n := allocated(func() {
			within(t, time.Minute, "guest interfaces", func() { _, err = p.GuestInterfaces(cctx, name) })
		})
		if !errors.Is(err, ErrReplyTooLong) {
			t.Fatalf("guest interfaces: %v, want %v; %d KiB allocated", err, ErrReplyTooLong, n>>10)
		}
		t.Logf("%v; %d KiB allocated", err, n>>10)
	})
	t.Run("ssh banner", func(t *testing.T) {
		ssh := p.Address(name).SSH
		deadline := time.Now().Add(2 * time.Minute)
		for {
			var err error
			n := allocated(func() {
				within(t, time.Minute, "ssh banner", func() { err = sshBanner(ctx, ssh) })
			})
			var ne net.Error
			switch {
			case errors.Is(err, ErrReplyTooLong):
				t.Logf("%v; %d KiB allocated", err, n>>10)
				return
			case errors.As(err, &ne) && ne.Timeout(), err == nil, time.Now().After(deadline):
				t.Fatalf("ssh banner from the guest: %v, want %v; %d KiB allocated", err, ErrReplyTooLong, n>>10)
			}
			time.Sleep(200 * time.Millisecond) // the forward closed: nc not listening yet
		}
	})
}

// A QEMU that is stopped (SIGSTOP: it accepts QMP connections in its
// socket's backlog and never answers, as a hung or compromised one would)
// is stopped by the ladder's signals, whatever deadline the caller has.
func TestStopOfAHungQEMUIsBounded(t *testing.T) {
	needQEMU(t)
	t.Parallel()
	srv := newArtifactServer(t)
	spec := guestSpec(t, srv)
	vmRoot := t.TempDir()
	p := newTestProvisioner(t, t.TempDir(), vmRoot, srv)
	p.cfg.PowerdownTimeout, p.cfg.KillTimeout = time.Second, time.Second
	name := "hung"
	m := agent.Machine{Name: name, Dir: filepath.Join(vmRoot, name), Spec: spec, InstanceID: "i-hung"}
	os.MkdirAll(m.Dir, 0o700)
	t.Cleanup(func() { p.Destroy(context.Background(), name) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if err := p.PrepareRootDisk(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := p.Boot(ctx, m); err != nil {
		t.Fatal(err)
	}
	pid := p.machines[name].pid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var err error
	start := time.Now()
	within(t, 3*time.Minute, "shutdown of a stopped QEMU", func() { err = p.Shutdown(ctx, name) })
	if err != nil {
		t.Fatal(err)
	}
	if p.Running(name) {
		t.Error("running after Shutdown")
	}
	t.Logf("a stopped QEMU was shut down in %.1fs", time.Since(start).Seconds())
}

// BenchmarkQGACallOfAFloodingGuest measures what one guest agent call
// costs the agent against a guest that streams bytes without a newline
// into its channel: B/op is bounded by MaxReplyBytes (about 2 MiB), not by
// what the guest sends.
//
//	go test ./agent/qemu -run '^$' -bench QGACallOfAFloodingGuest -benchmem
func BenchmarkQGACallOfAFloodingGuest(b *testing.B) {
	sock := filepath.Join(b.TempDir(), QGASocket)
	l, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for {
					if _, err := c.Write(zeros); err != nil {
						return
					}
				}
			}()
		}
	}()
	b.ReportAllocs()
	for b.Loop() {
		if err := qgaCall(context.Background(), sock, "guest-ping", nil, nil); !errors.Is(err, ErrReplyTooLong) {
			b.Fatalf("guest-ping: %v", err)
		}
	}
}

// bootScripted boots the tiny guest as VM name with userData as its
// cloud-init script, on its own provisioner (its VMs under
// filepath.Dir(m.Dir)), destroyed when the test ends, and returns the
// artifact server it fetched the guest from.
func bootScripted(t *testing.T, name, userData string) (*Provisioner, agent.Machine, *artifactServer) {
	t.Helper()
	srv := newArtifactServer(t)
	spec := guestSpec(t, srv)
	spec.CloudInit = &desired.CloudInit{UserData: userData}
	vmRoot := t.TempDir()
	p := newTestProvisioner(t, t.TempDir(), vmRoot, srv)
	m := agent.Machine{Name: name, Dir: filepath.Join(vmRoot, name), Spec: spec, InstanceID: "i-" + name}
	os.MkdirAll(m.Dir, 0o700)
	t.Cleanup(func() { p.Destroy(context.Background(), name) })
	if err := p.PrepareRootDisk(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	if err := p.Boot(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	return p, m, srv
}
