package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// QEMU runs as its own user and can neither open nor create a path in the
// VM's directory (vmdir.go): a file or a socket it needs while it runs is
// made by the agent and handed over as a descriptor, over one QMP
// connection (SCM_RIGHTS), bounded as every QMP call is (channelCall).

// qmpSession opens a QMP connection to sock and negotiates capabilities,
// for calls that must share one connection.
func qmpSession(ctx context.Context, sock string) (*channelCall, *json.Decoder, error) {
	c, err := dialChannel(ctx, sock)
	if err != nil {
		return nil, nil, err
	}
	dec := json.NewDecoder(c.r)
	var greeting struct {
		QMP *json.RawMessage `json:"QMP"`
	}
	if err := dec.Decode(&greeting); err != nil {
		c.close()
		return nil, nil, fmt.Errorf("no greeting: %w", err)
	}
	if greeting.QMP == nil {
		c.close()
		return nil, nil, errors.New("no greeting")
	}
	if _, err := qmpExchange(c.conn, dec, "qmp_capabilities", nil); err != nil {
		c.close()
		return nil, nil, fmt.Errorf("negotiate capabilities: %w", err)
	}
	return c, dec, nil
}

// qmpSendFile runs command with args on the session c, passing f's
// descriptor with it (SCM_RIGHTS), and returns its reply.
func qmpSendFile(c *channelCall, dec *json.Decoder, f *os.File, command string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	conn, ok := c.conn.(*net.UnixConn)
	if !ok {
		return nil, fmt.Errorf("%s: the monitor is not a unix socket", command)
	}
	if _, _, err := conn.WriteMsgUnix(append(b, '\n'), unix.UnixRights(int(f.Fd())), nil); err != nil {
		return nil, err
	}
	return qmpReply(dec)
}

// qmpWithFile opens a file node on f for QEMU: one QMP connection passes
// f's descriptor (add-fd), adds the node on /dev/fdset/N with the rest of
// args (blockdev-add), and removes the descriptor from the set again
// (remove-fd: the node keeps its own duplicate, and the set goes when the
// node does). QEMU drops an fd set nobody uses when the monitor
// connection that made it closes, so the three run on one connection.
func qmpWithFile(ctx context.Context, sock string, f *os.File, node map[string]any) error {
	c, dec, err := qmpSession(ctx, sock)
	if err != nil {
		return fmt.Errorf("qmp add-fd: %w", err)
	}
	defer c.close()
	raw, err := qmpSendFile(c, dec, f, "add-fd", nil)
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
	_, addErr := qmpExchange(c.conn, dec, "blockdev-add", args)
	if _, err := qmpExchange(c.conn, dec, "remove-fd", map[string]any{"fdset-id": set.ID}); err != nil && addErr == nil {
		return fmt.Errorf("qmp remove-fd: %w", err)
	}
	if addErr != nil {
		return fmt.Errorf("qmp blockdev-add: %w", addErr)
	}
	return nil
}

// nbdFDName is the name the NBD server's listening socket is passed to
// QEMU under (getfd).
const nbdFDName = "gf-nbd"

// qmpStartNBD starts QEMU's NBD server on a listening unix socket the
// agent made at dir/name: its descriptor is passed to QEMU (getfd) and
// the server started on it (nbd-server-start, address type fd), on one
// connection. The socket is the agent's, in the agent's directory; QEMU
// never needs to make a name there.
func qmpStartNBD(ctx context.Context, sock, dir, name string) error {
	l, err := listenVMSocket(dir, name)
	if err != nil {
		return fmt.Errorf("nbd socket: %w", err)
	}
	defer l.Close()
	c, dec, err := qmpSession(ctx, sock)
	if err != nil {
		return fmt.Errorf("qmp getfd: %w", err)
	}
	defer c.close()
	if _, err := qmpSendFile(c, dec, l, "getfd", map[string]any{"fdname": nbdFDName}); err != nil {
		return fmt.Errorf("qmp getfd: %w", err)
	}
	if _, err := qmpExchange(c.conn, dec, "nbd-server-start", map[string]any{
		"addr": map[string]any{"type": "fd", "data": map[string]any{"str": nbdFDName}}}); err != nil {
		qmpExchange(c.conn, dec, "closefd", map[string]any{"fdname": nbdFDName})
		return fmt.Errorf("qmp nbd-server-start: %w", err)
	}
	return nil
}

// listenVMSocket makes a listening unix socket at dir/name (whatever was
// at name removed first, never followed; bound through /proc/self/fd of
// the directory, so a deep directory fits sun_path) and returns its
// descriptor. The name stays when the descriptor is closed.
func listenVMSocket(dir, name string) (*os.File, error) {
	if err := removeVMFile(dir, name); err != nil {
		return nil, err
	}
	dfd, err := openVMDir(dir)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	addr := fmt.Sprintf("/proc/self/fd/%d/%s", dfd, filepath.Base(name))
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", filepath.Join(dir, name), err)
	}
	l.SetUnlinkOnClose(false)
	f, err := l.File()
	l.Close()
	return f, err
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
