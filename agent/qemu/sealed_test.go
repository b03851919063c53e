package qemu

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"
	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/internal/sealed"
)

// keyring returns a fresh one-key keyring and its recipient.
func keyring(t *testing.T) (*sealed.Keyring, string) {
	t.Helper()
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	k, err := sealed.NewKeyring(id)
	if err != nil {
		t.Fatal(err)
	}
	return k, id.Recipient().String()
}

// sealedProvisioner is a Provisioner (no QEMU started) holding keys, with
// its log in buf.
func sealedProvisioner(t *testing.T, keys *sealed.Keyring, buf *bytes.Buffer) (*Provisioner, string) {
	t.Helper()
	root := t.TempDir()
	log := logrus.New()
	log.SetOutput(buf)
	p, err := New(Config{
		CacheDir: filepath.Join(root, "images"), Accel: AccelTCG, RunAs: "root", AgeIdentity: keys,
		MachineDir: func(name string) string { return filepath.Join(root, name) },
		Logger:     log,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p, root
}

func sealedMachine(t *testing.T, root, recipient, plain, instanceID string) agent.Machine {
	t.Helper()
	ct, err := sealed.Seal(recipient, "web-01", []byte(plain))
	if err != nil {
		t.Fatal(err)
	}
	return agent.Machine{Name: "web-01", Dir: filepath.Join(root, "web-01"), InstanceID: instanceID, Spec: desired.VMSpec{
		Host: "hv-a", VCPUs: 1, MemoryMB: 128, DiskGB: 1,
		CloudInit: &desired.CloudInit{
			SSHAuthorizedKeys: []string{"ssh-ed25519 AAAAC3Nza k"},
			EncryptedUserData: &desired.EncryptedUserData{Recipient: recipient, Ciphertext: ct},
		},
	}}
}

// seedOf builds m's seed as Boot does and reads the ISO back.
func seedOf(t *testing.T, p *Provisioner, m agent.Machine) (map[string][]byte, error) {
	t.Helper()
	st, err := p.machineState(m)
	if err != nil {
		t.Fatal(err)
	}
	files, err := p.machineSeed(st, m, seedNICs(m, nil))
	if err != nil {
		return nil, err
	}
	if err := writeSeedISO(st.path(SeedFile), files); err != nil {
		t.Fatal(err)
	}
	_, got, err := readSeedISO(st.path(SeedFile))
	if err != nil {
		t.Fatal(err)
	}
	return got, nil
}

// Encrypted user-data reaches the seed decrypted, byte for byte; the
// meta-data and network-config carry nothing of it.
func TestSeedDecryptsEncryptedUserData(t *testing.T) {
	const secret = "#!/bin/sh\necho 'S3CR3T-token-7f3a' > /root/token\n"
	keys, recipient := keyring(t)
	var logs bytes.Buffer
	p, root := sealedProvisioner(t, keys, &logs)
	m := sealedMachine(t, root, recipient, secret, "web-01-1111")
	if err := os.MkdirAll(m.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	got, err := seedOf(t, p, m)
	if err != nil {
		t.Fatal(err)
	}
	if string(got["user-data"]) != secret {
		t.Errorf("seed user-data = %q, want the plaintext %q", got["user-data"], secret)
	}
	for _, f := range []string{"meta-data", "network-config"} {
		if bytes.Contains(got[f], []byte("S3CR3T")) || bytes.Contains(got[f], []byte("AGE ENCRYPTED")) {
			t.Errorf("%s carries user-data: %s", f, got[f])
		}
	}
	if !bytes.Contains(got["meta-data"], []byte("ssh-ed25519 AAAAC3Nza k")) {
		t.Errorf("meta-data lost the public keys: %s", got["meta-data"])
	}
	if strings.Contains(logs.String(), "S3CR3T") {
		t.Errorf("the log holds the plaintext:\n%s", logs.String())
	}
}

// User-data encrypted to another key: a new VM's seed is a permanent
// error naming the keys, never the content; a VM with a seed of its own
// instance already (the host's key changed after its create) keeps that
// seed's user-data, so it boots again.
func TestSeedOfUserDataEncryptedToAnotherKey(t *testing.T) {
	const secret = "#cloud-config\npassword: S3CR3T-hunter2\n"
	hostKeys, hostRecipient := keyring(t)
	_, otherRecipient := keyring(t)

	var logs bytes.Buffer
	p, root := sealedProvisioner(t, hostKeys, &logs)
	m := sealedMachine(t, root, otherRecipient, secret, "web-01-2222")
	if err := os.MkdirAll(m.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := seedOf(t, p, m)
	if err == nil || !agent.IsPermanent(err) || !errors.Is(err, sealed.ErrNotForThisHost) {
		t.Fatalf("seed of user-data encrypted to another key: %v; want a permanent ErrNotForThisHost", err)
	}
	if !strings.Contains(err.Error(), otherRecipient) || !strings.Contains(err.Error(), hostRecipient) || strings.Contains(err.Error(), "S3CR3T") {
		t.Errorf("error should name both keys and no content: %v", err)
	}

	// Created while the host held the key: its seed exists.
	old, oldRecipient := keyring(t)
	pOld, _ := sealedProvisioner(t, old, &logs)
	pOld.cfg.MachineDir = p.cfg.MachineDir
	created := sealedMachine(t, root, oldRecipient, secret, "web-01-3333")
	if _, err := seedOf(t, pOld, created); err != nil {
		t.Fatal(err)
	}
	// The host's key changed: the same VM's next seed keeps the old
	// seed's user-data.
	got, err := seedOf(t, p, created)
	if err != nil {
		t.Fatalf("a created VM whose key changed cannot get a seed: %v", err)
	}
	if string(got["user-data"]) != secret {
		t.Errorf("user-data = %q, want the existing seed's", got["user-data"])
	}
	if !strings.Contains(logs.String(), "existing seed") || strings.Contains(logs.String(), "S3CR3T") {
		t.Errorf("the log should say the existing seed is kept, without content:\n%s", logs.String())
	}
	// Another instance (the VM created again) never takes an old seed.
	again := created
	again.InstanceID = "web-01-4444"
	if _, err := seedOf(t, p, again); err == nil {
		t.Error("a VM created again took the user-data of its previous instance's seed")
	}

	// An agent without any identity refuses, naming the setting.
	pNone, rootNone := sealedProvisioner(t, nil, &logs)
	none := sealedMachine(t, rootNone, hostRecipient, secret, "web-01-5555")
	if err := os.MkdirAll(none.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := seedOf(t, pNone, none); err == nil || !strings.Contains(err.Error(), "ageIdentity") {
		t.Errorf("no identity: %v, want an error naming ageIdentity", err)
	}
}
