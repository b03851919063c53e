package trust_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/testsupport/trusttest"
	"github.com/gitfleet/gitfleet/trust"
)

// A key's validity is judged at the time Verify is given, whatever the
// commit's own dates say: an SSH key's valid-before and valid-after, and
// an OpenPGP key's expiry and revocation (the keys and signatures made
// with gpg's clock set in the past). A key out of its validity is
// refused as expired, not yet valid or revoked — never as a bad
// signature — naming the bound and the time judged at.
func TestVerifyJudgesValidityAtTheTimeGiven(t *testing.T) {
	w := newWorktree(t)
	ann := trusttest.NewSSHKey(t, "ann")
	c := w.commit(ann.Sign())
	bound := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	until := sshSigners(t, `ann valid-before="20300101000000Z" `+ann.Public)
	from := sshSigners(t, `ann valid-after="20300101000000Z" `+ann.Public)
	if _, err := until.Verify(c, bound.Add(-time.Second)); err != nil {
		t.Fatalf("before valid-before: %v", err)
	}
	_, err := until.Verify(c, bound)
	if !errors.Is(err, trust.ErrKeyExpired) || !strings.Contains(err.Error(), "2030-01-01T00:00:00Z") || !strings.Contains(err.Error(), "judged at 2030-01-01T00:00:00Z") {
		t.Fatalf("at valid-before: %v, want ErrKeyExpired naming the bound and the time judged at", err)
	}
	if _, err := from.Verify(c, bound); err != nil {
		t.Fatalf("at valid-after: %v", err)
	}
	if _, err := from.Verify(c, bound.Add(-time.Second)); !errors.Is(err, trust.ErrKeyNotYetValid) {
		t.Fatalf("before valid-after: %v, want ErrKeyNotYetValid", err)
	}
	if _, err := until.Verify(c, time.Time{}); err == nil || errors.Is(err, trust.ErrSignature) {
		t.Fatalf("no time to judge at: %v, want an error that is no refusal of the commit", err)
	}

	made := time.Now().Add(-30 * 24 * time.Hour)
	pgp := trusttest.NewGPGKeyAt(t, "Bob <bob@example.com>", made, "10d")
	signedAt := made.Add(24 * time.Hour)
	pc := w.commit(pgp.SignAt(signedAt))
	keyring := pgpSigners(t, pgp.Armored)
	if _, err := keyring.Verify(pc, signedAt.Add(time.Hour)); err != nil {
		t.Fatalf("judged while the OpenPGP key was valid: %v", err)
	}
	_, err = keyring.Verify(pc, time.Now())
	if !errors.Is(err, trust.ErrKeyExpired) || errors.Is(err, trust.ErrBadSignature) || !strings.Contains(err.Error(), "expired at "+made.Add(10*24*time.Hour).UTC().Format("2006-01-02T15")) {
		t.Fatalf("judged after its expiry: %v, want ErrKeyExpired naming when", err)
	}
	if _, err := keyring.Verify(pc, made.Add(-time.Hour)); !errors.Is(err, trust.ErrKeyNotYetValid) {
		t.Fatalf("judged before the key was made: %v, want ErrKeyNotYetValid", err)
	}

	cara := trusttest.NewGPGKeyAt(t, "Cara <cara@example.com>", made, "never")
	cc := w.commit(cara.SignAt(signedAt))
	revokedAt := signedAt.Add(48 * time.Hour)
	revoked := pgpSigners(t, cara.Revoke(t, revokedAt))
	if _, err := revoked.Verify(cc, revokedAt.Add(-time.Hour)); err != nil {
		t.Fatalf("judged before the revocation: %v", err)
	}
	if _, err := revoked.Verify(cc, revokedAt.Add(time.Hour)); !errors.Is(err, trust.ErrKeyRevoked) {
		t.Fatalf("judged after the revocation: %v, want ErrKeyRevoked", err)
	}
}

// FirstSeen keeps the first time a commit was seen, or an earlier one it
// learns; full, it forgets the most recently first seen.
func TestFirstSeen(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := trust.NewFirstSeen(3)
	if got := f.At("a", t0); !got.Equal(t0) {
		t.Fatalf("a first seen %v", got)
	}
	if got := f.At("a", t0.Add(time.Hour)); !got.Equal(t0) {
		t.Fatalf("a seen again: %v, want the first time", got)
	}
	f.Learn("a", t0.Add(-time.Hour))
	f.Learn("a", t0.Add(5*time.Hour))
	if got, _ := f.Seen("a"); !got.Equal(t0.Add(-time.Hour)) {
		t.Fatalf("a after learning: %v, want the earliest", got)
	}
	f.At("b", t0.Add(time.Minute))
	f.At("c", t0.Add(2*time.Minute))
	f.At("d", t0.Add(3*time.Minute)) // full: c, the newest, goes
	if _, ok := f.Seen("c"); ok || f.Len() != 3 {
		t.Fatalf("len %d, c kept %v", f.Len(), ok)
	}
	for _, c := range []string{"a", "b", "d"} {
		if _, ok := f.Seen(c); !ok {
			t.Errorf("%s forgotten", c)
		}
	}
	f.Keep([]string{"b"})
	if _, ok := f.Seen("a"); ok || f.Len() != 1 {
		t.Fatalf("after Keep(b): len %d", f.Len())
	}
}
