package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/sirupsen/logrus"
)

// QMPEventsSocket is a second QMP monitor of each VM, which the backend
// keeps connected to for as long as it watches the VM's QEMU, to read
// its asynchronous events: QMPSocket serves one client at a time, for
// one command each, and a QMP event is sent only to the clients
// connected when it happens. QEMU makes it at start, as it makes
// QMPSocket (-qmp unix:…,server=on,wait=off, relative to the VM's
// directory, before it drops root).
const QMPEventsSocket = "qmp-events.sock"

// eventsRetry is how long the event reader waits before it connects
// again after its connection failed or ended.
const eventsRetry = time.Second

// A guest reset begins a new boot in the same QEMU process: QEMU sends
// RESET (a reboot from inside the guest, a system_reset), or, under
// -no-reboot, SHUTDOWN with one of these reasons.
var resetShutdownReasons = map[string]bool{"guest-reset": true, "host-qmp-system-reset": true}

// qmpEvent is one asynchronous QMP message: its name and what it says of
// a reset or a shutdown.
type qmpEvent struct {
	Event string `json:"event"`
	Data  struct {
		Guest  bool   `json:"guest"`
		Reason string `json:"reason"`
	} `json:"data"`
}

// isReset reports whether ev begins a new boot of the guest.
func (ev qmpEvent) isReset() bool {
	return ev.Event == "RESET" || (ev.Event == "SHUTDOWN" && resetShutdownReasons[ev.Data.Reason])
}

// eventLoop reads the VM's QMP events on QMPEventsSocket for as long as
// ctx lasts and calls reset, with the time it was read and QEMU's reason,
// for every guest reset. A connection that fails or ends is made again
// after eventsRetry. Every message is bounded by MaxReplyBytes, the
// greeting and the capabilities negotiation by channelTimeout; a QEMU
// that sends a longer line has its connection closed.
func eventLoop(ctx context.Context, sock string, log *logrus.Entry, reset func(at time.Time, reason string)) {
	logged := ""
	for ctx.Err() == nil {
		err := readEvents(ctx, sock, reset)
		if ctx.Err() != nil {
			return
		}
		if msg := err.Error(); msg != logged {
			// Once per kind of failure: a QEMU of an older agent has
			// no events socket, and a failing one would fail each time.
			log.WithError(err).Debug("qmp events")
			logged = msg
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(eventsRetry):
		}
	}
}

// readEvents is one connection of eventLoop: it returns when the
// connection fails or ends, or ctx ends.
func readEvents(ctx context.Context, sock string, reset func(time.Time, string)) error {
	conn, r, err := eventSession(ctx, sock)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	conn.SetDeadline(time.Time{}) // events come when they come
	for {
		line, err := readLine(r, MaxReplyBytes)
		if err != nil {
			return err
		}
		var ev qmpEvent
		if json.Unmarshal(line, &ev) != nil || !ev.isReset() {
			continue
		}
		reason := ev.Event
		if ev.Data.Reason != "" {
			reason += " " + ev.Data.Reason
		}
		reset(time.Now(), reason)
	}
}

// eventSession connects to the events monitor at sock and negotiates
// capabilities, within channelTimeout; the reader returned reads past
// the negotiation.
func eventSession(ctx context.Context, sock string) (net.Conn, *bufio.Reader, error) {
	hctx, cancel := context.WithTimeout(ctx, channelTimeout)
	defer cancel()
	conn, err := dialSocket(hctx, sock)
	if err != nil {
		return nil, nil, err
	}
	dl, _ := hctx.Deadline()
	conn.SetDeadline(dl)
	r := bufio.NewReader(conn)
	greeting, err := readLine(r, MaxReplyBytes)
	if err == nil && !json.Valid(greeting) {
		err = errors.New("no greeting")
	}
	if err == nil {
		_, err = conn.Write([]byte(`{"execute":"qmp_capabilities"}` + "\n"))
	}
	for err == nil {
		var line []byte
		if line, err = readLine(r, MaxReplyBytes); err != nil {
			break
		}
		var reply struct {
			Return json.RawMessage `json:"return"`
			Error  *qmpError       `json:"error"`
		}
		if json.Unmarshal(line, &reply) != nil {
			continue
		}
		if reply.Error != nil {
			err = reply.Error
		}
		if reply.Return != nil || reply.Error != nil {
			break
		}
	}
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("qmp events %s: %w", sock, err)
	}
	return conn, r, nil
}

// readLine reads one line of at most max bytes from r, without its end.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > max {
			return nil, fmt.Errorf("%w: a line longer than %d bytes", ErrReplyTooLong, max)
		}
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case !errors.Is(err, bufio.ErrBufferFull):
			return nil, err
		}
	}
}
