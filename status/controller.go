package status

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"time"

	"go.yaml.in/yaml/v3"
)

// ControllerPath is the controller's own report on the status branch,
// beside SummaryPath: the failure that keeps its passes from acting, while
// one does. It is absent while passes succeed. Only a controller that has
// completed a pass since it started writes it (one that never did may not
// be the one the branches belong to).
const ControllerPath = "controller.yaml"

// MaxControllerBytes is the largest controller.yaml a reader parses
// (64 KiB; a PassFailure's reason is bounded by internal/safetext well
// below it).
const MaxControllerBytes = 64 << 10

// The outcomes a PassFailure records (fleet.OutcomeUnreadable and
// fleet.OutcomeRefused).
const (
	FailureUnreadable = "unreadable"
	FailureRefused    = "refused"
)

// PassFailure is why the controller's passes leave the last good snapshots
// in place for a reason that is not the desired commit's (a commit that is
// invalid is the ledger's last rejected commit, kept apart): Outcome
// "unreadable" (git failed: the remote unreachable or stalled, the cache
// unwritable) or "refused" (the controller will not act: an epoch past
// the bound, a VM to retain without its last spec). Since is the
// controller's clock at the first pass that failed with this outcome and
// reason. Reason is valid UTF-8 without control characters, at most 50
// lines (internal/safetext).
type PassFailure struct {
	Outcome string    `yaml:"outcome" json:"outcome"`
	Since   time.Time `yaml:"since" json:"since"`
	Reason  string    `yaml:"reason" json:"reason"`
}

// controllerFile is the layout of controller.yaml.
type controllerFile struct {
	Failing *PassFailure `yaml:"failing"`
}

// MarshalPassFailure renders f as controller.yaml.
func MarshalPassFailure(f *PassFailure) ([]byte, error) {
	return yaml.Marshal(controllerFile{Failing: f})
}

// ParsePassFailure parses controller.yaml at path; nil when it records no
// failure. A file over MaxControllerBytes, with unknown fields or an
// outcome other than the two is an error naming path.
func ParsePassFailure(path string, data []byte) (*PassFailure, error) {
	if len(data) > MaxControllerBytes {
		return nil, fmt.Errorf("%s: %d bytes, at most %d are read", path, len(data), MaxControllerBytes)
	}
	var f controllerFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if f.Failing != nil && f.Failing.Outcome != FailureUnreadable && f.Failing.Outcome != FailureRefused {
		return nil, fmt.Errorf("%s: failing.outcome %q: want %s or %s", path, f.Failing.Outcome, FailureUnreadable, FailureRefused)
	}
	return f.Failing, nil
}
