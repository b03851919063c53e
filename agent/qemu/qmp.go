package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// maxSunPath is the usable length of a unix socket path on Linux: sun_path
// holds 108 bytes including the terminating NUL.
const maxSunPath = 107

// qmpCommand runs one QMP command on the monitor socket at sock and returns
// its "return" value. Every step (dial, greeting, capabilities negotiation,
// the command) is bounded by ctx: a QEMU that accepts the connection but
// never answers costs at most ctx's deadline.
//
// This is a small client of our own rather than
// github.com/digitalocean/go-qemu/qmp: that client works over a unix socket
// but gives no way to bound a read (its connection is unexported, Connect
// and Run block until QEMU answers), and a hung QEMU is exactly what a
// re-attach or a stop must survive.
//
// Socket paths longer than sun_path allows are reached through
// /proc/self/fd/N/<base> with N an O_PATH descriptor of the directory, so a
// VM directory may be as deep as the state store puts it.
func qmpCommand(ctx context.Context, sock, command string, args any) (json.RawMessage, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	addr := sock
	if len(sock) > maxSunPath {
		dirfd, err := unix.Open(filepath.Dir(sock), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("qmp %s: open socket directory: %w", command, err)
		}
		defer unix.Close(dirfd)
		addr = fmt.Sprintf("/proc/self/fd/%d/%s", dirfd, filepath.Base(sock))
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", addr)
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", command, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()

	r := bufio.NewReader(conn)
	dec := json.NewDecoder(r)
	var greeting struct {
		QMP *json.RawMessage `json:"QMP"`
	}
	if err := dec.Decode(&greeting); err != nil || greeting.QMP == nil {
		return nil, fmt.Errorf("qmp %s: no greeting: %v", command, err)
	}
	if _, err := qmpExchange(conn, dec, "qmp_capabilities", nil); err != nil {
		return nil, fmt.Errorf("qmp %s: negotiate capabilities: %w", command, err)
	}
	ret, err := qmpExchange(conn, dec, command, args)
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", command, err)
	}
	return ret, nil
}

// qmpError is an error QEMU returned for a command.
type qmpError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *qmpError) Error() string { return e.Class + ": " + e.Desc }

// qmpExchange sends one command and reads until its reply, skipping
// asynchronous events.
func qmpExchange(conn net.Conn, dec *json.Decoder, command string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return nil, err
	}
	for {
		var msg struct {
			Return json.RawMessage `json:"return"`
			Error  *qmpError       `json:"error"`
			Event  string          `json:"event"`
		}
		if err := dec.Decode(&msg); err != nil {
			return nil, err
		}
		switch {
		case msg.Error != nil:
			return nil, msg.Error
		case msg.Event != "":
			continue
		default:
			return msg.Return, nil
		}
	}
}

// qmpStatus returns the VM's run state as QMP query-status reports it
// ("running", "paused", "shutdown", "internal-error", …).
func qmpStatus(ctx context.Context, sock string) (string, error) {
	ret, err := qmpCommand(ctx, sock, "query-status", nil)
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(ret, &st); err != nil {
		return "", fmt.Errorf("qmp query-status: %w", err)
	}
	return st.Status, nil
}
