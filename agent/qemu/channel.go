package qemu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// A guest writes to its guest agent's channel, its SSH port and its
// serial console; a compromised QEMU writes to QMP and its own log. The
// agent runs as root and reads all of them, so every such read is bounded
// here, in bytes and in time: a peer that sends without end, or never
// answers, costs at most MaxReplyBytes (or a few lines) and channelTimeout,
// and the error says which bound it hit.

// ErrReplyTooLong is wrapped by a read from a channel a guest or QEMU
// writes to that received more than its bound without what it waits for:
// MaxReplyBytes for a QMP or guest agent call, an SSH identification line
// longer than sshLineMax.
var ErrReplyTooLong = errors.New("reply too long")

// MaxReplyBytes is the most one QMP or guest agent call reads from its
// channel, in bytes, everything before the reply included (a greeting,
// events, a stale reply, the sync): 1 MiB, some hundred times the largest
// reply these calls expect (guest-network-get-interfaces of a guest with
// dozens of interfaces).
const MaxReplyBytes = 1 << 20

// channelTimeout bounds one QMP or guest agent call, whatever the
// caller's deadline: a stop's ladder never waits longer than this for a
// QEMU that accepts and never answers.
const channelTimeout = 10 * time.Second

// SSH identification lines: RFC 4253 4.2 bounds the version line at 255
// bytes with its CR LF; the probe reads at most sshMaxLines lines.
const (
	sshLineMax  = 256
	sshMaxLines = 8
)

// budgetReader reads from r until max bytes were read, then fails with
// ErrReplyTooLong.
type budgetReader struct {
	r         io.Reader
	left, max int64
}

func newBudgetReader(r io.Reader, max int64) *budgetReader {
	return &budgetReader{r: r, left: max, max: max}
}

func (b *budgetReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, fmt.Errorf("%w: more than %d bytes without the reply", ErrReplyTooLong, b.max)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

// channelCall is a connection to the unix socket at sock for one call:
// every read and write is bounded by ctx and by channelTimeout, and reads
// go through a budget of MaxReplyBytes. close ends it.
type channelCall struct {
	conn  net.Conn
	r     *bufio.Reader
	close func()
}

// dialChannel opens a channelCall to sock (see dialSocket for how).
func dialChannel(ctx context.Context, sock string) (*channelCall, error) {
	ctx, cancel := context.WithTimeout(ctx, channelTimeout)
	conn, err := dialSocket(ctx, sock)
	if err != nil {
		cancel()
		return nil, err
	}
	dl, _ := ctx.Deadline()
	conn.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	return &channelCall{
		conn: conn,
		r:    bufio.NewReader(newBudgetReader(conn, MaxReplyBytes)),
		close: func() {
			stop()
			conn.Close()
			cancel()
		},
	}, nil
}

// sshBanner dials addr and reads its identification line, which must
// start with "SSH-" (RFC 4253 4.2; a server may send other lines first,
// which are skipped): at most sshMaxLines lines of at most sshLineMax
// bytes each, within sshDialTimeout to connect and sshBannerTimeout to
// read.
func sshBanner(ctx context.Context, addr string) error {
	d := net.Dialer{Timeout: sshDialTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(sshBannerTimeout))
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	r := bufio.NewReaderSize(conn, sshLineMax)
	for i := 0; i < sshMaxLines; i++ {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			return fmt.Errorf("ssh banner from %s: %w: a line longer than %d bytes", addr, ErrReplyTooLong, sshLineMax)
		}
		if strings.HasPrefix(string(line), "SSH-") {
			return nil
		}
		if err != nil {
			return fmt.Errorf("ssh banner from %s: %w", addr, err)
		}
	}
	return fmt.Errorf("ssh banner from %s: none in the first %d lines", addr, sshMaxLines)
}
