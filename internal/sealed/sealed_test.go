package sealed

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"
	"filippo.io/age/armor"
)

// newIdentityFile writes a fresh identity file with mode perm and returns
// its path and recipient.
func newIdentityFile(t *testing.T, perm os.FileMode) (string, string) {
	t.Helper()
	file, recipient, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "age.key")
	if err := os.WriteFile(path, []byte(file), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
	return path, recipient
}

func TestSealOpensOnlyWithItsHostsIdentity(t *testing.T) {
	const secret = "#cloud-config\npassword: hunter2-secret-value\n"
	path, recipient := newIdentityFile(t, 0o600)
	keys, err := LoadKeyring(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := keys.Recipients(); len(got) != 1 || got[0] != recipient || !keys.Holds(recipient) {
		t.Fatalf("keyring holds %v, want [%s]", got, recipient)
	}
	ct, err := Seal(recipient, "web-01", []byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(ct, "hunter2") || !strings.HasPrefix(ct, ArmorHeader) {
		t.Fatalf("ciphertext is not an armored age file without the plaintext:\n%s", ct)
	}
	if err := CheckCiphertext(ct); err != nil {
		t.Errorf("CheckCiphertext of Seal's output: %v", err)
	}
	plain, err := keys.Open(ct, "web-01")
	if err != nil || string(plain) != secret {
		t.Fatalf("Open = %q, %v; want the plaintext", plain, err)
	}

	other, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	otherKeys, err := NewKeyring(other)
	if err != nil {
		t.Fatal(err)
	}
	_, err = otherKeys.Open(ct, "web-01")
	if !errors.Is(err, ErrNotForThisHost) {
		t.Fatalf("Open with another key: %v, want ErrNotForThisHost", err)
	}
	if !strings.Contains(err.Error(), other.Recipient().String()) || strings.Contains(err.Error(), "AGE-SECRET-KEY") {
		t.Errorf("error should name the recipient held and no secret key: %v", err)
	}
	var none *Keyring
	if _, err := none.Open(ct, "web-01"); err == nil || !strings.Contains(err.Error(), "ageIdentity") {
		t.Errorf("nil keyring: %v, want an error naming the ageIdentity setting", err)
	}

	// Rotation: a file holding the old and the new key opens both.
	both, err := NewKeyring(other, keys.ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if plain, err := both.Open(ct, "web-01"); err != nil || string(plain) != secret {
		t.Errorf("two-key keyring: %q, %v", plain, err)
	}
}

func TestLoadKeyringRefusesFilesOthersCanRead(t *testing.T) {
	for _, perm := range []os.FileMode{0o644, 0o640, 0o604, 0o660} {
		path, _ := newIdentityFile(t, perm)
		if _, err := LoadKeyring(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
			t.Errorf("mode %04o: %v, want a refusal naming chmod 600", perm, err)
		}
	}
	path, _ := newIdentityFile(t, 0o400)
	if _, err := LoadKeyring(path); err != nil {
		t.Errorf("mode 0400: %v", err)
	}
	link := filepath.Join(t.TempDir(), "link.key")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKeyring(link); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("symlink: %v, want a refusal", err)
	}
	garbage := filepath.Join(t.TempDir(), "bad.key")
	if err := os.WriteFile(garbage, []byte("AGE-SECRET-KEY-1NOTAKEY-but-looks-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadKeyring(garbage)
	if err == nil || strings.Contains(err.Error(), "NOTAKEY") {
		t.Errorf("malformed identity: %v, want an error that quotes no key", err)
	}
	if _, err := LoadKeyring(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing file loaded")
	}
}

func TestParseRecipient(t *testing.T) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	pq, err := age.GenerateHybridIdentity()
	if err != nil {
		t.Fatal(err)
	}
	for _, good := range []string{id.Recipient().String(), pq.Recipient().String()} {
		if _, err := ParseRecipient(good); err != nil {
			t.Errorf("%.20s…: %v", good, err)
		}
	}
	for _, tc := range []struct{ in, want, never string }{
		{"age1notbech32atall", "not an age recipient", ""},
		{"ssh-ed25519 AAAA", "starts with age1", ""},
		{"", "starts with age1", ""},
		{id.String(), "secret key, not a recipient", id.String()[16:]},
	} {
		_, err := ParseRecipient(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.in, err, tc.want)
			continue
		}
		if tc.never != "" && strings.Contains(err.Error(), tc.never) {
			t.Errorf("the error quotes the secret key: %v", err)
		}
	}
}

func TestCheckCiphertext(t *testing.T) {
	_, recipient := newIdentityFile(t, 0o600)
	ct, err := Seal(recipient, "web-01", []byte("#!/bin/sh\necho hi\n"))
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		in   string
		want string
	}{
		"plaintext":        {"#cloud-config\npassword: x\n", "not an ASCII-armored age file"},
		"binary age":       {"age-encryption.org/v1\n-> X25519 abc\n", "not an ASCII-armored age file"},
		"truncated armor":  {ct[:len(ct)/2], "not a well-formed age file"},
		"garbage in armor": {ArmorHeader + "\n!!!!\n-----END AGE ENCRYPTED FILE-----\n", "not a well-formed age file"},
	} {
		if err := CheckCiphertext(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	if err := CheckCiphertext("\n  " + ct); err != nil {
		t.Errorf("leading white space: %v", err)
	}
}

// Decrypting user-data costs the agent one X25519 unwrap per seed.
func BenchmarkOpen(b *testing.B) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		b.Fatal(err)
	}
	keys, _ := NewKeyring(id)
	ct, err := Seal(id.Recipient().String(), "web-01", []byte(strings.Repeat("#cloud-config\n", 300)))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := keys.Open(ct, "web-01"); err != nil {
			b.Fatal(err)
		}
	}
}

// MaxPlaintext bytes seal and open; one more is refused by Seal.
func TestSealBoundsThePlaintext(t *testing.T) {
	path, recipient := newIdentityFile(t, 0o600)
	keys, err := LoadKeyring(path)
	if err != nil {
		t.Fatal(err)
	}
	most := bytes.Repeat([]byte("x"), MaxPlaintext)
	ct, err := Seal(recipient, "web-01", most)
	if err != nil {
		t.Fatalf("Seal of MaxPlaintext bytes: %v", err)
	}
	if plain, err := keys.Open(ct, "web-01"); err != nil || !bytes.Equal(plain, most) {
		t.Fatalf("Open of MaxPlaintext bytes: %d bytes, %v", len(plain), err)
	}
	if _, err := Seal(recipient, "web-01", append(most, 'x')); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("Seal of MaxPlaintext+1 bytes: %v, want refused", err)
	}
}

// A ciphertext copied from one VM's file into another's on the same host
// (opaque to review) does not open for the other VM, and an age file not
// sealed for a VM (age -r, say) opens for none; the error quotes no
// user-data.
func TestOpenBindsTheVM(t *testing.T) {
	path, recipient := newIdentityFile(t, 0o600)
	keys, err := LoadKeyring(path)
	if err != nil {
		t.Fatal(err)
	}
	ct, err := Seal(recipient, "db-01", []byte("password: hunter2\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = keys.Open(ct, "web-01")
	if !errors.Is(err, ErrOtherVM) || !strings.Contains(err.Error(), `VM "db-01", not "web-01"`) || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("Open for another VM: %v, want ErrOtherVM naming both VMs", err)
	}
	// A VM whose name is a prefix of the sealed one's is another VM.
	if _, err := keys.Open(ct, "db-0"); !errors.Is(err, ErrOtherVM) {
		t.Fatalf("Open for a VM named by a prefix: %v, want ErrOtherVM", err)
	}

	r, err := age.ParseX25519Recipient(recipient)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	aw := armor.NewWriter(&buf)
	w, err := age.Encrypt(aw, r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("password: hunter2\n")); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := aw.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = keys.Open(buf.String(), "web-01")
	if !errors.Is(err, ErrOtherVM) || !strings.Contains(err.Error(), "not sealed by gitfleet encrypt") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("Open of an age file sealed for no VM: %v, want ErrOtherVM", err)
	}
	if _, err := Seal(recipient, "", []byte("x")); err == nil {
		t.Fatal("Seal without a VM name: want an error")
	}
}
