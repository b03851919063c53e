// Package sealed encrypts a VM's user-data to the host that runs it, with
// age (https://age-encryption.org/v1, package filippo.io/age), and opens it
// on that host alone.
//
// The parts, and who uses each:
//
//   - a recipient is a host's public key, "age1…" (X25519) or "age1pq1…"
//     (ML-KEM-768 + X25519), as `age-keygen -y` or `gitfleet age-keygen`
//     prints it; the Host object names it (spec.ageRecipient) and
//     ParseRecipient checks it (validate, encrypt);
//   - Seal encrypts one VM's user-data to one recipient as an
//     ASCII-armored age file ("-----BEGIN AGE ENCRYPTED FILE-----"), which
//     the VM's file carries in spec.cloudInit.encryptedUserData (gitfleet
//     encrypt); the VM's name is sealed with it (VMLine), so the file
//     opens for that VM only;
//   - CheckCiphertext checks an armored age file's shape without any key
//     (validate): the controller never decrypts;
//   - a Keyring is the agent's identity file (LoadKeyring, which refuses a
//     file others can read), and Open decrypts with it when the agent
//     builds a VM's NoCloud seed.
//
// No function here puts plaintext or a secret key in an error: errors are
// printed, logged and written to status files.
package sealed

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"filippo.io/age"
	"filippo.io/age/armor"
	"github.com/gitfleet/gitfleet/internal/secretfile"
)

// ArmorHeader starts every armored age file Seal writes and Open reads.
const ArmorHeader = "-----BEGIN AGE ENCRYPTED FILE-----"

// MaxPlaintext bounds, in bytes, the user-data Seal encrypts and Open
// returns (the bound CheckUserData holds user-data to; a NoCloud seed is
// small).
const MaxPlaintext = 4 << 20

// VMLine starts the plaintext Seal encrypts: "gitfleet-vm: NAME\n", then
// the user-data. Age authenticates the whole plaintext, so the line binds
// the ciphertext to the VM it was sealed for: one copied into another
// VM's file (a ciphertext is opaque to review) is refused by Open.
const VMLine = "gitfleet-vm: "

// ErrOtherVM is what Open's error matches when the file was sealed for
// another VM, or without a VM name (not by Seal).
var ErrOtherVM = errors.New("sealed for another VM")

// ErrNotForThisHost is what Open's error matches (errors.Is) when no
// identity of the keyring opens the file: it was encrypted to another key.
var ErrNotForThisHost = errors.New("encrypted to a key this host does not hold")

// ParseRecipient parses an age recipient: "age1…" (X25519) or "age1pq1…"
// (post-quantum hybrid). The error says what a recipient looks like and
// quotes at most its first 12 characters (a secret key pasted by mistake,
// "AGE-SECRET-KEY-1…", is not quoted at all).
func ParseRecipient(s string) (age.Recipient, error) {
	switch {
	case strings.HasPrefix(strings.ToUpper(s), "AGE-SECRET-KEY-"):
		return nil, errors.New("is an age secret key, not a recipient: put the secret key in the agent's identity file only and give the public key (age-keygen -y FILE, or gitfleet age-keygen, prints it)")
	case strings.HasPrefix(s, "age1pq1"):
		r, err := age.ParseHybridRecipient(s)
		if err != nil {
			return nil, fmt.Errorf("%q… is not an age post-quantum recipient: %v", prefix(s), err)
		}
		return r, nil
	case strings.HasPrefix(s, "age1"):
		r, err := age.ParseX25519Recipient(s)
		if err != nil {
			return nil, fmt.Errorf("%q… is not an age recipient: %v", prefix(s), err)
		}
		return r, nil
	}
	return nil, fmt.Errorf("%q… is not an age recipient: one starts with age1 (the public key age-keygen -y FILE, or gitfleet age-keygen, prints)", prefix(s))
}

func prefix(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

// Seal encrypts plaintext (at most MaxPlaintext bytes), the user-data of
// the VM named vm, to recipient and returns the armored age file, ending
// in a newline. The VM's name is sealed with it (VMLine).
func Seal(recipient, vm string, plaintext []byte) (string, error) {
	if len(plaintext) > MaxPlaintext {
		return "", fmt.Errorf("user-data is %d bytes; at most %d", len(plaintext), MaxPlaintext)
	}
	if vm == "" || strings.ContainsAny(vm, "\r\n") {
		return "", fmt.Errorf("VM name %q: want a VM's metadata.name", vm)
	}
	r, err := ParseRecipient(recipient)
	if err != nil {
		return "", fmt.Errorf("recipient %w", err)
	}
	var buf bytes.Buffer
	aw := armor.NewWriter(&buf)
	w, err := age.Encrypt(aw, r)
	if err != nil {
		return "", fmt.Errorf("encrypt: %w", err)
	}
	if _, err := io.WriteString(w, VMLine+vm+"\n"); err != nil {
		return "", fmt.Errorf("encrypt: %w", err)
	}
	if _, err := w.Write(plaintext); err != nil {
		return "", fmt.Errorf("encrypt: %w", err)
	}
	if err := w.Close(); err != nil {
		return "", fmt.Errorf("encrypt: %w", err)
	}
	if err := aw.Close(); err != nil {
		return "", fmt.Errorf("encrypt: %w", err)
	}
	return buf.String(), nil
}

// CheckCiphertext reports why armored is not an ASCII-armored age file
// (the header line, base64 armor, an age v1 header), or nil. It reads no
// key and learns nothing of the plaintext.
func CheckCiphertext(armored string) error {
	t := strings.TrimLeft(armored, " \t\r\n")
	if !strings.HasPrefix(t, ArmorHeader) {
		return fmt.Errorf("is not an ASCII-armored age file, which starts with %q (gitfleet encrypt writes one)", ArmorHeader)
	}
	if _, err := age.ExtractHeader(armor.NewReader(strings.NewReader(t))); err != nil {
		return fmt.Errorf("is not a well-formed age file: %v", err)
	}
	return nil
}

// Keyring is a host's age identities: the secret keys that open user-data
// sealed to the host's recipients. Several may be held at once, so a
// host's key can be rotated without a window in which VMs sealed to the
// old one cannot be opened. Safe for concurrent use; never changed after
// it is made.
type Keyring struct {
	// Path is the identity file it was read from ("" when made by
	// NewKeyring), named in errors.
	Path       string
	ids        []age.Identity
	recipients []string
}

// NewKeyring makes a keyring of identities, each an *age.X25519Identity or
// an *age.HybridIdentity (anything else is an error).
func NewKeyring(ids ...age.Identity) (*Keyring, error) {
	k := &Keyring{ids: ids}
	for _, id := range ids {
		switch id := id.(type) {
		case *age.X25519Identity:
			k.recipients = append(k.recipients, id.Recipient().String())
		case *age.HybridIdentity:
			k.recipients = append(k.recipients, id.Recipient().String())
		default:
			return nil, fmt.Errorf("identity of type %T: want an age X25519 or post-quantum identity", id)
		}
	}
	if len(k.ids) == 0 {
		return nil, errors.New("no identity")
	}
	return k, nil
}

// LoadKeyring reads an age identity file (age-keygen's format: one
// "AGE-SECRET-KEY-1…" or "AGE-SECRET-KEY-PQ-1…" line per key, "#"
// comments). The file must be a regular file (not a symbolic link) that
// only its owner may read or write (mode 0600 or 0400), owned by this
// process's user or by root: anyone else who can read it can read every
// VM's user-data. Errors name the file and never quote a key.
func LoadKeyring(path string) (*Keyring, error) {
	data, err := secretfile.Read(path, "age identity", "others can read the key that opens every VM's user-data", 1<<20)
	if err != nil {
		return nil, err
	}
	ids, err := age.ParseIdentities(bytes.NewReader(data))
	if err != nil {
		// age's parse errors name a line, never its content.
		return nil, fmt.Errorf("age identity %s: %v", path, err)
	}
	k, err := NewKeyring(ids...)
	if err != nil {
		return nil, fmt.Errorf("age identity %s: %v", path, err)
	}
	k.Path = path
	return k, nil
}

// Recipients are the public keys of the keyring's identities, in file
// order: what the Host object's spec.ageRecipient may name.
func (k *Keyring) Recipients() []string { return append([]string(nil), k.recipients...) }

// Holds reports whether recipient is the public key of one of the
// keyring's identities; a nil keyring holds none.
func (k *Keyring) Holds(recipient string) bool {
	if k == nil {
		return false
	}
	for _, r := range k.recipients {
		if r == recipient {
			return true
		}
	}
	return false
}

// Open decrypts an armored age file with the keyring and returns the
// user-data Seal sealed for the VM named vm. An error matching
// ErrNotForThisHost means no identity opens it; ErrOtherVM, that it was
// sealed for another VM (or not by Seal); any other, that it is damaged or
// too large (MaxPlaintext). A nil keyring opens nothing: the error says
// the agent has no identity.
func (k *Keyring) Open(armored, vm string) ([]byte, error) {
	if k == nil {
		return nil, errors.New("this host has no age identity: set ageIdentity in the agent's configuration (gitfleet age-keygen prints the setup)")
	}
	r, err := age.Decrypt(armor.NewReader(strings.NewReader(strings.TrimLeft(armored, " \t\r\n"))), k.ids...)
	if err != nil {
		var nomatch *age.NoIdentityMatchError
		if errors.As(err, &nomatch) {
			return nil, fmt.Errorf("%w (this host holds %s)", ErrNotForThisHost, strings.Join(k.recipients, ", "))
		}
		return nil, fmt.Errorf("decrypt: %v", err)
	}
	want := VMLine + vm + "\n"
	b, err := io.ReadAll(io.LimitReader(r, int64(len(want))+MaxPlaintext+1))
	if err != nil {
		return nil, fmt.Errorf("decrypt: %v", err)
	}
	if !bytes.HasPrefix(b, []byte(want)) {
		sealedFor := "no VM (it was not sealed by gitfleet encrypt)"
		if line, _, ok := bytes.Cut(b, []byte("\n")); ok && bytes.HasPrefix(line, []byte(VMLine)) && len(line) <= len(VMLine)+253 {
			sealedFor = fmt.Sprintf("VM %q", strings.TrimPrefix(string(line), VMLine))
		}
		return nil, fmt.Errorf("%w: sealed for %s, not %q; encrypt this VM's own user-data (gitfleet encrypt)", ErrOtherVM, sealedFor, vm)
	}
	b = b[len(want):]
	if len(b) > MaxPlaintext {
		return nil, fmt.Errorf("decrypt: plaintext larger than %d bytes", MaxPlaintext)
	}
	return b, nil
}

// Generate makes a new X25519 identity and returns the identity file's
// content (age-keygen's format, with the public key in a comment) and the
// recipient.
func Generate() (file, recipient string, err error) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		return "", "", err
	}
	recipient = id.Recipient().String()
	return "# gitfleet host identity: opens user-data sealed to it\n# public key: " + recipient + "\n" + id.String() + "\n", recipient, nil
}
