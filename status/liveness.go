package status

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"time"

	"go.yaml.in/yaml/v3"
)

// LivenessPath is the controller's judgement of every host it lists in
// README.md, on the status branch beside SummaryPath and written in the
// same commit: the Hosts table's state, for `gitfleet status` to show
// without parsing Markdown. A controller of an earlier release writes none.
const LivenessPath = "liveness.yaml"

// MaxLivenessBytes is the largest liveness.yaml a reader parses (4 MiB:
// about 40000 hosts).
const MaxLivenessBytes = 4 << 20

// The states of a host, by the controller's own clock (HostSummary.State).
const (
	// StateOnline: its status file changed within the controller's
	// offline-after.
	StateOnline = "online"
	// StateOffline: no change of its status file for offline-after.
	StateOffline = "offline"
	// StateNoStatus: a Host object (or a snapshot) exists, but no agent
	// has reported for it.
	StateNoStatus = "no status yet"
	// StateUnreadable: its status file does not parse.
	StateUnreadable = "status unreadable"
)

// HostState is one host as the controller judges it. Retired is set for a
// host whose Host object the applied desired state no longer has, listed
// while its snapshot stays (deletes delivered to it wait for its ack).
// Unsigned is HostSummary.Unsigned: why the host's status commit is not
// signed by its Host's spec.agentKey, "" when it is or the Host names
// none (a reader of an earlier release refuses a file that sets it).
type HostState struct {
	Host     string `yaml:"host" json:"host"`
	State    string `yaml:"state" json:"state"`
	Retired  bool   `yaml:"retired,omitempty" json:"retired,omitempty"`
	Unsigned string `yaml:"unsigned,omitempty" json:"unsigned,omitempty"`
}

// livenessFile is the layout of liveness.yaml.
type livenessFile struct {
	Hosts []HostState `yaml:"hosts"`
}

// Liveness is the liveness.yaml of s: every host of its Hosts table, in
// its order. It is MarshalLiveness(LivenessStates(s)).
func Liveness(s Summary) ([]byte, error) {
	return MarshalLiveness(LivenessStates(s))
}

// LivenessStates is the rows of liveness.yaml of s: every host of its
// Hosts table, in its order. A writer that keeps the last rows and their
// encoding encodes again only when they changed (1,000 hosts cost some
// 10 ms of YAML encoding).
func LivenessStates(s Summary) []HostState {
	rows := make([]HostState, 0, len(s.Hosts))
	for _, h := range s.Hosts {
		rows = append(rows, HostState{Host: h.Name, State: h.State(), Retired: h.Retired, Unsigned: h.Unsigned})
	}
	return rows
}

// MarshalLiveness encodes rows as liveness.yaml.
func MarshalLiveness(rows []HostState) ([]byte, error) {
	return yaml.Marshal(livenessFile{Hosts: rows})
}

// ParseLiveness parses liveness.yaml at path into a map from host name to
// its state. A file over MaxLivenessBytes, with unknown fields, a host
// without a name or a state other than the four is an error naming path.
func ParseLiveness(path string, data []byte) (map[string]HostState, error) {
	if len(data) > MaxLivenessBytes {
		return nil, fmt.Errorf("%s: %d bytes, at most %d are read", path, len(data), MaxLivenessBytes)
	}
	var f livenessFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := make(map[string]HostState, len(f.Hosts))
	for i, h := range f.Hosts {
		switch {
		case h.Host == "":
			return nil, fmt.Errorf("%s: hosts[%d]: no host name", path, i)
		case h.State != StateOnline && h.State != StateOffline && h.State != StateNoStatus && h.State != StateUnreadable:
			return nil, fmt.Errorf("%s: hosts[%d] (%s): state %q: want %s, %s, %s or %s", path, i, h.Host, h.State,
				StateOnline, StateOffline, StateNoStatus, StateUnreadable)
		}
		out[h.Host] = h
	}
	return out, nil
}

// State is the host's state in the Hosts table: StateUnreadable,
// StateNoStatus, StateOnline or StateOffline, in that order of precedence.
func (h HostSummary) State() string {
	switch {
	case h.StatusError != "":
		return StateUnreadable
	case !h.Reported:
		return StateNoStatus
	case h.Online:
		return StateOnline
	}
	return StateOffline
}

// RetiredNote is what the Hosts table and `gitfleet status` add to the
// state of a retired host.
const RetiredNote = "retired: no Host object; listed until it acks the deletes delivered to it"

// UnsignedNote is what the Hosts table and `gitfleet status` add to the
// state of a host whose status commit is not signed by its Host's
// spec.agentKey, and each of its VM rows to its note.
const UnsignedNote = "status not signed by the Host's agentKey: unverified, not acted on"

// NoStatusSince is what the Hosts table and `gitfleet status` add to the
// state of an offline host whose last status was observed at at (its
// observedAt; nothing when zero): the controller sees no status, and
// cannot tell a host that is down from one cut off from git or one whose
// writes git refuses (the agent's log, gitfleet_agent_status_write_refused
// and /healthz say which).
func NoStatusSince(at time.Time) string {
	if at.IsZero() {
		return ""
	}
	return "no status since " + at.UTC().Format(time.RFC3339) + " (down, cut off from git, or its writes refused: its agent's log and /healthz say which)"
}

// VMHostNote is the note a VM's row carries for what its host's state
// means for it, "" when nothing: the row of an offline host is its last
// report, and a suspended host applies no change.
func VMHostNote(state string, suspended bool) string {
	switch {
	case state == StateOffline:
		return "host offline: as last reported"
	case suspended:
		return "host suspended: changes wait"
	}
	return ""
}
