package demo

import (
	"bytes"
	"io"
	"os"
	"strings"

	"github.com/gitfleet/gitfleet/agent/qemu"
	"github.com/gitfleet/gitfleet/internal/tinyguest"
)

// console follows one VM's serial log and returns the tiny guest's lines
// (those holding tinyguest.LinePrefix) that were completed since the
// last call, without the prefix. QEMU appends each boot's output to the
// log; a log shorter than what was read (rotated, see qemu.SerialLogMax)
// is read from the top.
type console struct {
	path   string
	offset int64
	tail   []byte // an incomplete last line
}

// restart makes the next read start from the top of the log.
func (c *console) restart() {
	c.offset, c.tail = 0, nil
}

// skip reads the log up to its current end without returning its lines:
// for a guest that was already running, whose lines are old news.
func (c *console) skip() {
	for {
		at := c.offset
		c.read()
		if c.offset == at {
			return
		}
	}
}

// fromLastBoot makes the next read start at the current boot: just past
// the log's last qemu.BootMarker line (the backend writes one before each
// QEMU start and at each guest reset), from the top when it has none.
// Without it a console made for a guest that just booted replayed the
// boots of earlier runs, which the log keeps.
func (c *console) fromLastBoot() {
	c.restart()
	data, err := os.ReadFile(c.path)
	if err != nil {
		return
	}
	i := bytes.LastIndex(data, []byte(qemu.BootMarker))
	for i > 0 && data[i-1] != '\n' {
		i = bytes.LastIndex(data[:i], []byte(qemu.BootMarker))
	}
	if i < 0 {
		return
	}
	if end := bytes.IndexByte(data[i:], '\n'); end >= 0 {
		c.offset = int64(i + end + 1)
	} else {
		c.offset, c.tail = int64(len(data)), nil
	}
}

func (c *console) read() []string {
	f, err := os.Open(c.path)
	if err != nil {
		return nil
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() < c.offset {
		c.restart()
	}
	if _, err := f.Seek(c.offset, io.SeekStart); err != nil {
		return nil
	}
	data, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil || len(data) == 0 {
		return nil
	}
	c.offset += int64(len(data))
	data = append(c.tail, data...)
	end := bytes.LastIndexByte(data, '\n')
	if end < 0 {
		c.tail = data
		return nil
	}
	c.tail = append([]byte(nil), data[end+1:]...)
	var lines []string
	for _, line := range strings.Split(string(data[:end]), "\n") {
		line = strings.TrimRight(line, "\r")
		// A kernel message may be printed into the middle of a line.
		i := strings.Index(line, tinyguest.LinePrefix)
		if i < 0 {
			continue
		}
		lines = append(lines, line[i+len(tinyguest.LinePrefix):])
	}
	return lines
}
