// Package peakrss measures the peak resident memory of a process for
// benchmarks that run the code under test in a child process: the child
// calls Print when done, the parent finds the figure in its output with
// Parse. The child reads its own high-water mark (VmHWM in
// /proc/self/status, Linux only) because rusage's Maxrss of a child also
// counts the memory its parent had at the fork.
package peakrss

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// marker starts the line Print writes and Parse looks for.
const marker = "peakrss-kib: "

// Self returns the peak resident memory of this process so far, in KiB.
func Self() (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			return strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("no VmHWM in /proc/self/status")
}

// Print writes this process's peak resident memory to w as one line
// that Parse finds.
func Print(w io.Writer) error {
	kib, err := Self()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "\n%s%d\n", marker, kib)
	return err
}

// Parse finds the figure Print wrote in a child's output, in KiB; the last
// one wins.
func Parse(out []byte) (int64, error) {
	i := bytes.LastIndex(out, []byte(marker))
	if i < 0 {
		return 0, errors.New("the child printed no peak RSS")
	}
	line, _, _ := bytes.Cut(out[i+len(marker):], []byte("\n"))
	return strconv.ParseInt(strings.TrimSpace(string(line)), 10, 64)
}
