package status

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"time"

	"go.yaml.in/yaml/v3"
)

// LastWritePath says when the controller last wrote the status branch:
// beside SummaryPath, written in every one of its commits there, so a
// reader tells a summary that is the controller's current view from the
// last view of a controller that stopped. A controller of an earlier
// release writes none.
const LastWritePath = "last-write.yaml"

// MaxLastWriteBytes is the largest last-write.yaml a reader parses (4 KiB).
const MaxLastWriteBytes = 4 << 10

// StaleRefreshes is how many refresh intervals old a LastWrite may be
// before readers call the controller's view stale: a controller that runs
// writes at least once per interval, an idle fleet included (at its first
// pass after the interval's end, a failed push retried at the next pass),
// so three intervals leave room for a slow remote and a failing pass
// backing off, and never fire on a healthy fleet.
const StaleRefreshes = 3

// LastWrite is the layout of last-write.yaml: At is the controller's clock
// when it wrote the commit (RFC 3339, UTC); RefreshSeconds the longest
// it lets pass between two writes of the status branch when nothing
// changed (fleet.Config.SummaryInterval, in seconds).
type LastWrite struct {
	At             time.Time `yaml:"at" json:"at"`
	RefreshSeconds int64     `yaml:"refreshSeconds" json:"refreshSeconds"`
}

// Refresh is RefreshSeconds as a duration.
func (w LastWrite) Refresh() time.Duration { return time.Duration(w.RefreshSeconds) * time.Second }

// Age is how long before now (the reader's clock) the controller wrote,
// never negative (a reader whose clock lags the controller's reads 0).
func (w LastWrite) Age(now time.Time) time.Duration { return max(now.Sub(w.At), 0) }

// Stale reports whether the controller's last write is older than
// StaleRefreshes refresh intervals at now: it stopped, or cannot write.
func (w LastWrite) Stale(now time.Time) bool {
	return w.Age(now) > StaleRefreshes*w.Refresh()
}

// MarshalLastWrite encodes w as last-write.yaml, At in UTC to the second.
func MarshalLastWrite(w LastWrite) ([]byte, error) {
	w.At = w.At.UTC().Truncate(time.Second)
	return yaml.Marshal(w)
}

// ParseLastWrite parses last-write.yaml at path. A file over MaxLastWriteBytes,
// without a time or without a positive refresh interval is an error
// naming path; fields it does not know are read past (a later release may
// add some, and its file must not hide the time from this reader).
func ParseLastWrite(path string, data []byte) (LastWrite, error) {
	if len(data) > MaxLastWriteBytes {
		return LastWrite{}, fmt.Errorf("%s: %d bytes, at most %d are read", path, len(data), MaxLastWriteBytes)
	}
	var w LastWrite
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&w); err != nil && !errors.Is(err, io.EOF) {
		return LastWrite{}, fmt.Errorf("%s: %w", path, err)
	}
	switch {
	case w.At.IsZero():
		return LastWrite{}, fmt.Errorf("%s: at: no time", path)
	case w.RefreshSeconds <= 0:
		return LastWrite{}, fmt.Errorf("%s: refreshSeconds: %d, want a positive number of seconds", path, w.RefreshSeconds)
	}
	return w, nil
}
