package gitsource

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"
)

// pkt is one pkt-line holding s.
func pkt(s string) string { return fmt.Sprintf("%04x%s", len(s)+4, s) }

// shallowFlood is a remote's side of a shallow fetch: the ref
// advertisement (main at a made-up commit), and an answer that starts
// with n shallow lines.
func shallowFlood(n int) (adv, answer string) {
	tip := strings.Repeat("ab", 20)
	adv = pkt(tip+" HEAD\x00shallow side-band-64k ofs-delta no-progress agent=git/2\n") + pkt(tip+" refs/heads/main\n") + "0000"
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "%s", pkt(fmt.Sprintf("shallow %040x\n", i)))
	}
	b.WriteString("0000" + pkt("NAK\n"))
	return adv, b.String()
}

// A server that answers a shallow fetch with 20,000 shallow lines (go-git
// would hold them all and merge them in time squared) fails the fetch
// with ErrTooManyShallows, over http and over the file transport; it is
// a git failure, not cache damage. An answer within the bound passes the
// reader byte for byte.
func TestShallowLinesBounded(t *testing.T) {
	adv, answer := shallowFlood(2 * maxShallowLines)
	for name, url := range map[string]string{"http": serveAnswer(t, adv, answer), "file": serveAnswerFile(t, adv, answer)} {
		r, err := Open(context.Background(), Options{URL: url, CacheDir: filepath.Join(t.TempDir(), "cache"), Depth: 1})
		require.NoError(t, err, name)
		_, err = r.Fetch(context.Background(), "main")
		t.Logf("%s: %v", name, err)
		require.ErrorIs(t, err, ErrTooManyShallows, name)
		require.False(t, repairable(err), name)
		r.Close()
	}

	_, small := shallowFlood(3)
	got, err := io.ReadAll(limitShallow(strings.NewReader(small + "PACK...")))
	require.NoError(t, err)
	require.True(t, bytes.Equal([]byte(small+"PACK..."), got))
}

// go-git reads on past an ACK or NAK in the shallow section (it skips
// lines it does not know there) and holds every ACK line that follows:
// neither ends the bound. Lines flooded after a NAK, after a flush, or as
// ACKs fail with ErrTooManyShallows; a well-formed answer with its pack in
// side-band packets, or raw, passes byte for byte.
func TestShallowBoundNotEndedByACKOrNAK(t *testing.T) {
	defer func(n int) { maxShallowLines = n }(maxShallowLines)
	maxShallowLines = 100
	var shallows, acks strings.Builder
	for i := 0; i < 200; i++ {
		shallows.WriteString(pkt(fmt.Sprintf("shallow %040x\n", i)))
		acks.WriteString(pkt(fmt.Sprintf("ACK %040x\n", i)))
	}
	for name, answer := range map[string]string{
		"shallow lines after a NAK":   pkt("NAK\n") + shallows.String() + "0000",
		"shallow lines after a flush": "0000" + shallows.String() + "0000",
		"an ACK flood":                "0000" + acks.String() + "PACK",
	} {
		_, err := io.ReadAll(limitShallow(strings.NewReader(answer)))
		require.ErrorIs(t, err, ErrTooManyShallows, name)
	}
	for name, answer := range map[string]string{
		"side-band pack": pkt("shallow "+strings.Repeat("a", 40)+"\n") + "0000" + pkt("NAK\n") + pkt("\x01PACK"+strings.Repeat("x", 1000)) + "0000",
		"raw pack":       "0000" + pkt("NAK\n") + "PACK" + strings.Repeat("\x00", 1000),
	} {
		got, err := io.ReadAll(limitShallow(strings.NewReader(answer)))
		require.NoError(t, err, name)
		require.Equal(t, answer, string(got), name)
	}
}

// Pkt-lines split across reads (a remote that writes one byte at a time)
// are bounded the same, and pass byte for byte within the bound.
func TestShallowBoundOverOneByteReads(t *testing.T) {
	defer func(n int) { maxShallowLines = n }(maxShallowLines)
	maxShallowLines = 10
	_, flood := shallowFlood(20)
	_, err := io.ReadAll(limitShallow(iotest.OneByteReader(strings.NewReader(flood))))
	require.ErrorIs(t, err, ErrTooManyShallows)
	_, small := shallowFlood(3)
	got, err := io.ReadAll(limitShallow(iotest.OneByteReader(strings.NewReader(small + "PACK..."))))
	require.NoError(t, err)
	require.Equal(t, small+"PACK...", string(got))
}
