package desired

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/gitfleet/gitfleet/internal/safetext"
)

// ParseAgentKey parses a Host's spec.agentKey: one SSH public key line as
// a .pub file holds it ("ssh-ed25519 AAAA… [comment]"), parsed by
// golang.org/x/crypto/ssh's ParseAuthorizedKey; options, a second key and
// a private key are refused. The error quotes at most the value's start.
func ParseAgentKey(line string) (ssh.PublicKey, error) {
	if strings.Contains(line, "PRIVATE KEY") {
		return nil, errors.New("is a private key: give the public key line (the .pub file), and take the private key out of the repository's history")
	}
	key, _, options, rest, err := ssh.ParseAuthorizedKey([]byte(line))
	switch {
	case err != nil:
		return nil, fmt.Errorf("%q is not an SSH public key line (want keytype base64-key [comment], as in the agent key's .pub file)", safetext.Truncate(line, 24))
	case len(options) > 0:
		return nil, errors.New("holds options before the key; give the key line alone")
	case len(bytes.TrimSpace(rest)) > 0:
		return nil, errors.New("holds more than one key; give the one key the agent signs with")
	}
	return key, nil
}
