package qemu

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
)

// qmpCommand runs one QMP command on the monitor socket at sock and returns
// its "return" value. The call is a channelCall: every step (dial,
// greeting, capabilities negotiation, the command) is bounded by ctx and
// by channelTimeout, and everything read by MaxReplyBytes: a QEMU that
// accepts the connection but never answers costs at most channelTimeout
// (10 s), one that sends without end at most MaxReplyBytes
// (ErrReplyTooLong).
//
// This is a small client of our own rather than
// github.com/digitalocean/go-qemu/qmp: that client works over a unix socket
// but gives no way to bound a read (its connection is unexported, Connect
// and Run block until QEMU answers), and a hung QEMU is exactly what a
// re-attach or a stop must survive.
func qmpCommand(ctx context.Context, sock, command string, args any) (json.RawMessage, error) {
	c, dec, err := qmpSession(ctx, sock)
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", command, err)
	}
	defer c.close()
	ret, err := qmpExchange(c.conn, dec, command, args)
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
