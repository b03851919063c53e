package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// qmpWithFile opens a file node on f for QEMU, which runs as its own user
// and cannot open a path under the agent's state directory itself: one
// QMP connection passes f's descriptor (add-fd, SCM_RIGHTS), adds the
// node on /dev/fdset/N with the rest of args (blockdev-add), and removes
// the descriptor from the set again (remove-fd: the node keeps its own
// duplicate, and the set goes when the node does). QEMU drops an fd set
// nobody uses when the monitor connection that made it closes, so the
// three run on one connection. Bounded by ctx (10 s without a deadline).
func qmpWithFile(ctx context.Context, sock string, f *os.File, node map[string]any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	addr := sock
	if len(sock) > maxSunPath {
		dirfd, err := unix.Open(filepath.Dir(sock), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("qmp add-fd: open socket directory: %w", err)
		}
		defer unix.Close(dirfd)
		addr = fmt.Sprintf("/proc/self/fd/%d/%s", dirfd, filepath.Base(sock))
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", addr)
	if err != nil {
		return fmt.Errorf("qmp add-fd: %w", err)
	}
	conn := c.(*net.UnixConn)
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	dec := json.NewDecoder(bufio.NewReader(conn))
	var greeting struct {
		QMP *json.RawMessage `json:"QMP"`
	}
	if err := dec.Decode(&greeting); err != nil || greeting.QMP == nil {
		return fmt.Errorf("qmp add-fd: no greeting: %v", err)
	}
	if _, err := qmpExchange(conn, dec, "qmp_capabilities", nil); err != nil {
		return fmt.Errorf("qmp add-fd: negotiate capabilities: %w", err)
	}
	req, _ := json.Marshal(map[string]any{"execute": "add-fd"})
	if _, _, err := conn.WriteMsgUnix(append(req, '\n'), unix.UnixRights(int(f.Fd())), nil); err != nil {
		return fmt.Errorf("qmp add-fd: %w", err)
	}
	raw, err := qmpReply(dec)
	if err != nil {
		return fmt.Errorf("qmp add-fd: %w", err)
	}
	var set struct {
		ID int `json:"fdset-id"`
	}
	if err := json.Unmarshal(raw, &set); err != nil {
		return fmt.Errorf("qmp add-fd: %w", err)
	}
	args := map[string]any{}
	for k, v := range node {
		args[k] = v
	}
	args["filename"] = fmt.Sprintf("/dev/fdset/%d", set.ID)
	_, addErr := qmpExchange(conn, dec, "blockdev-add", args)
	if _, err := qmpExchange(conn, dec, "remove-fd", map[string]any{"fdset-id": set.ID}); err != nil && addErr == nil {
		return fmt.Errorf("qmp remove-fd: %w", err)
	}
	if addErr != nil {
		return fmt.Errorf("qmp blockdev-add: %w", addErr)
	}
	return nil
}

// qmpReply reads until the next command reply, skipping events.
func qmpReply(dec *json.Decoder) (json.RawMessage, error) {
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
		case msg.Event == "":
			return msg.Return, nil
		}
	}
}
