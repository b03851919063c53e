package gitsource

import (
	"strings"

	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/capability"

	"github.com/gitfleet/gitfleet/internal/safetext"
)

// maxRemoteMessage bounds, in bytes, what a push keeps of the remote's
// own messages (its sideband's progress channel: a pre-receive hook's
// output, a git host's "protected branch" text). The rest is dropped.
const maxRemoteMessage = 2048

// remoteMessages collects what a remote's receive-pack says during one
// push, for the error of a refused update: git prints it as "remote: …"
// lines, and without it a refusal reads as a bare "pre-receive hook
// declined". It keeps the first maxRemoteMessage bytes.
type remoteMessages struct {
	buf  []byte
	over bool
}

// Write keeps p while there is room; it never fails, so the push's
// report is always read to its end.
func (m *remoteMessages) Write(p []byte) (int, error) {
	keep := p
	if room := maxRemoteMessage - len(m.buf); len(keep) > room {
		m.over = true
		keep = keep[:max(room, 0)]
	}
	m.buf = append(m.buf, keep...)
	return len(p), nil
}

// said is the remote's messages as one printable line, its lines joined
// with " / " (progress lines ended by a carriage return are lines too),
// "" when it said nothing.
func (m *remoteMessages) said() string {
	if m == nil {
		return ""
	}
	var lines []string
	for _, l := range strings.FieldsFunc(string(m.buf), func(r rune) bool { return r == '\n' || r == '\r' }) {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return ""
	}
	s := strings.Join(lines, " / ")
	if m.over {
		s += " …"
	}
	return safetext.Line(s)
}

// askRemoteMessages asks the remote, through req, to send its messages
// on the sideband (side-band-64k, else side-band) where ar advertises
// it, quietly (no progress of its own) where it can, and returns where
// they are kept; nil when the remote has no sideband.
func askRemoteMessages(ar *packp.AdvRefs, req *packp.ReferenceUpdateRequest) *remoteMessages {
	band := capability.Sideband64k
	if !ar.Capabilities.Supports(band) {
		band = capability.Sideband
	}
	if !ar.Capabilities.Supports(band) || req.Capabilities.Set(band) != nil {
		return nil
	}
	if ar.Capabilities.Supports(capability.Quiet) {
		_ = req.Capabilities.Set(capability.Quiet)
	}
	m := &remoteMessages{}
	req.Progress = m
	return m
}
