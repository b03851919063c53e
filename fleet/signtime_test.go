package fleet

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/trusttest"
	"github.com/gitfleet/gitfleet/trust"
)

// A signature's validity is judged at the time the controller first saw
// the commit, never at the committer date its signer chose
// (docs/DESIGN.md, "Signed desired state").

// keyTime is t as an allowed-signers valid-after=/valid-before= value.
func keyTime(t time.Time) string { return t.UTC().Format("20060102150405") + "Z" }

// signersFrom parses allowed-signers lines.
func signersFrom(t *testing.T, lines string) *trust.Signers {
	t.Helper()
	list, err := trust.ParseAllowedSigners("allowed_signers", []byte(lines))
	if err != nil {
		t.Fatal(err)
	}
	s, err := trust.New(list, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// verifyingController is a controller over e's repository verifying in
// mode against signers, signing its snapshots with key when set.
func (e *env) verifyingController(mode VerifyMode, signers *trust.Signers, key *trusttest.SSHKey) *Controller {
	e.t.Helper()
	cfg := Config{URL: e.url, Clock: e.clock.Now, Logger: quietLogger(), SummaryInterval: -1, Verify: mode, Signers: signers}
	if key != nil {
		signer, err := trust.LoadCommitSigner(key.Private)
		if err != nil {
			e.t.Fatal(err)
		}
		cfg.SigningKey = signer
	}
	c, err := New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// A key whose allowed-signers line says valid-before yesterday signs a
// commit whose committer date is three days back: the controller first
// sees it now, after the key's bound, and refuses it as expired, in head
// and in every mode, naming the bound and when it saw the commit. The
// same key's commit dated now is refused the same way.
func TestRetiredSSHKeyBackdatedCommitRefused(t *testing.T) {
	ann := trusttest.NewSSHKey(t, "ann")
	bob := trusttest.NewSSHKey(t, "bob")
	for _, mode := range []VerifyMode{VerifyHead, VerifyEvery} {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, nil)
			now := e.clock.Now()
			allowed := signersFrom(t, fmt.Sprintf("ann@example.com valid-before=%q %s\nbob@example.com %s\n",
				keyTime(now.Add(-24*time.Hour)), ann.Public, bob.Public))
			e.commit(gittest.Edit{Write: baseFleet(), Message: "initial fleet", Sign: bob.Sign()})
			e.c = e.verifyingController(mode, allowed, nil)
			if res := e.pass(); res.Rejected != nil {
				t.Fatalf("bob's fleet: %v", res.Rejected)
			}
			backdated := editWeb(3, ann.Sign())
			backdated.Time = now.Add(-72 * time.Hour)
			head := e.commit(backdated)
			e.wantRejected(e.pass(), head, 2, desired.Hash(head).Short(), "expired", "first seen", now.Format(time.RFC3339))

			undated := e.commit(editWeb(4, ann.Sign()))
			e.wantRejected(e.pass(), undated, 2, "expired")
		})
	}
}

// The delete of a review reviewed by nobody: a retired key signs, with a
// committer date before the key's bound, a commit removing a VM. It is
// refused: no tombstone is published, the VM stays in its snapshot.
func TestRetiredKeyBackdatedDeleteNotApplied(t *testing.T) {
	ann := trusttest.NewSSHKey(t, "ann")
	bob := trusttest.NewSSHKey(t, "bob")
	e := newEnv(t, nil)
	now := e.clock.Now()
	allowed := signersFrom(t, fmt.Sprintf("ann@example.com valid-before=%q %s\nbob@example.com %s\n",
		keyTime(now.Add(-24*time.Hour)), ann.Public, bob.Public))
	e.commit(gittest.Edit{Write: baseFleet(), Message: "initial fleet", Sign: bob.Sign()})
	e.c = e.verifyingController(VerifyEvery, allowed, nil)
	e.pass()
	del := e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}, Message: "remove web-01", Sign: ann.Sign(), Time: now.Add(-72 * time.Hour)})
	res := e.pass()
	e.wantRejected(res, del, 2, "expired")
	if len(res.Tombstoned) != 0 || len(e.ledger().Tombstones) != 0 {
		t.Fatalf("a retired key's backdated delete tombstoned %v (ledger %+v)", res.Tombstoned, e.ledger().Tombstones)
	}
	if e.snapshot("hv-a").VM("web-01") == nil {
		t.Fatal("web-01 left its host's snapshot")
	}
}

// A commit the controller applied while its key was valid stays valid
// after the key's valid-before: the same controller passes on it again,
// and in every mode verifies it again under the next commit, by another
// key. With a signing key the time it was first seen is in the signed
// ledger, so a controller started afresh (no memory of its own) keeps it
// too; a commit by the retired key first seen after the bound is refused.
func TestCommitSeenWhileKeyValidStaysValid(t *testing.T) {
	ann := trusttest.NewSSHKey(t, "ann")
	bob := trusttest.NewSSHKey(t, "bob")
	ctl := trusttest.NewSSHKey(t, "gitfleet-controller")
	for _, signing := range []bool{false, true} {
		t.Run(fmt.Sprintf("signing key %v", signing), func(t *testing.T) {
			e := newEnv(t, nil)
			start := e.clock.Now()
			allowed := signersFrom(t, fmt.Sprintf("ann@example.com valid-before=%q %s\nbob@example.com %s\n",
				keyTime(start.Add(time.Hour)), ann.Public, bob.Public))
			var key *trusttest.SSHKey
			if signing {
				key = &ctl
			}
			e.commit(gittest.Edit{Write: baseFleet(), Message: "initial fleet", Sign: ann.Sign()})
			e.c = e.verifyingController(VerifyEvery, allowed, key)
			if res := e.pass(); res.Rejected != nil {
				t.Fatalf("ann's fleet while her key is valid: %v", res.Rejected)
			}
			e.clock.Add(2 * time.Hour) // ann's key is past its valid-before
			if res := e.pass(); res.Rejected != nil {
				t.Fatalf("the applied commit, seen while the key was valid, passed again: %v", res.Rejected)
			}
			e.commit(editWeb(3, bob.Sign()))
			if res := e.pass(); res.Rejected != nil || e.snapshot("hv-a").VM("web-01").Spec.VCPUs != 3 {
				t.Fatalf("bob's commit over ann's applied one: %+v", res)
			}
			if signing {
				e.c = e.verifyingController(VerifyEvery, allowed, key)
				if res := e.pass(); res.Rejected != nil {
					t.Fatalf("a controller started afresh over the signed ledger: %v", res.Rejected)
				}
			}
			late := e.commit(editWeb(4, ann.Sign()))
			res := e.pass()
			e.wantRejected(res, late, 3, "expired")
			if !strings.Contains(res.Rejected.Error(), start.Add(time.Hour).Format(time.RFC3339)) {
				t.Errorf("the refusal %q names no bound", res.Rejected)
			}
		})
	}
}

// An OpenPGP key that expired since it signed: its commit, first seen by
// the controller while the key was valid, is applied and stays applied
// (keep the key in the keyring while its commits are to be applied);
// one first seen after the expiry is refused as expired, not as a bad
// signature. The key and its signatures are made with gpg's clock set
// in the past, so the key has expired by the test's clock.
func TestExpiredOpenPGPKeyJudgedWhenFirstSeen(t *testing.T) {
	e := newEnv(t, nil)
	now := e.clock.Now()
	created := now.Add(-10 * 24 * time.Hour)
	ann := trusttest.NewGPGKeyAt(t, "Ann <ann@example.com>", created, "5d") // expired 5 days ago
	kr, err := trust.ParseKeyring("keyring.asc", []byte(ann.Armored))
	if err != nil {
		t.Fatal(err)
	}
	signers, err := trust.New(nil, kr)
	if err != nil {
		t.Fatal(err)
	}
	signedAt := created.Add(24 * time.Hour)
	e.commit(gittest.Edit{Write: baseFleet(), Message: "initial fleet", Sign: ann.SignAt(signedAt), Time: signedAt})
	e.clock.now = signedAt.Add(time.Hour) // the controller sees it while the key is valid
	e.c = e.verifyingController(VerifyEvery, signers, nil)
	if res := e.pass(); res.Rejected != nil {
		t.Fatalf("a commit first seen while its OpenPGP key was valid: %v", res.Rejected)
	}
	e.clock.now = now // the key has expired since
	if res := e.pass(); res.Rejected != nil {
		t.Fatalf("the applied commit after its key expired: %v", res.Rejected)
	}
	late := e.commit(gittest.Edit{Write: map[string]string{"vms/web-01.yaml": vmYAML("web-01", "hv-a", 3)}, Message: "web-01: 3 vCPUs",
		Sign: ann.SignAt(signedAt), Time: signedAt})
	res := e.pass()
	e.wantRejected(res, late, 2, "expired", ann.Fingerprint)
	if strings.Contains(res.Rejected.Error(), "bad signature") || strings.Contains(res.Rejected.Error(), "does not verify") {
		t.Errorf("an expired key's valid signature is called bad: %v", res.Rejected)
	}
}

// The record of when commits were first seen is the controller's own: in
// a ledger no controller key signed (no signing key; a forged commit above
// a signed one; a ledger adopted once by a person's check) a record saying
// a retired key's commit was seen long ago is not acted on, and the
// commit is refused as expired.
func TestForgedSignaturesSeenNotActedOn(t *testing.T) {
	ann := trusttest.NewSSHKey(t, "ann")
	bob := trusttest.NewSSHKey(t, "bob")
	ctl := trusttest.NewSSHKey(t, "gitfleet-controller")
	for _, tc := range []string{"no signing key", "forged over a signed ledger", "adopted ledger"} {
		t.Run(tc, func(t *testing.T) {
			e := newEnv(t, nil)
			now := e.clock.Now()
			allowed := signersFrom(t, fmt.Sprintf("ann@example.com valid-before=%q %s\nbob@example.com %s\n",
				keyTime(now.Add(-24*time.Hour)), ann.Public, bob.Public))
			e.commit(gittest.Edit{Write: baseFleet(), Message: "initial fleet", Sign: bob.Sign()})
			var key *trusttest.SSHKey
			if tc == "forged over a signed ledger" {
				key = &ctl
			}
			e.c = e.verifyingController(VerifyEvery, allowed, key)
			e.pass()
			late := e.commit(editWeb(3, ann.Sign()))
			tip := e.forgeLedger(func(l *snapshots.Ledger) {
				l.SignaturesSeen = append(l.SignaturesSeen, snapshots.SeenCommit{Commit: desired.Hash(late), At: now.Add(-30 * 24 * time.Hour)})
			}, nil)
			switch tc {
			case "no signing key":
				e.c = e.verifyingController(VerifyEvery, allowed, nil)
			case "adopted ledger":
				signer, err := trust.LoadCommitSigner(ctl.Private)
				if err != nil {
					t.Fatal(err)
				}
				if e.c, err = New(Config{URL: e.url, Clock: e.clock.Now, Logger: quietLogger(), SummaryInterval: -1, Verify: VerifyEvery,
					Signers: allowed, SigningKey: signer, TrustUnsignedLedgerOnce: tip}); err != nil {
					t.Fatal(err)
				}
			}
			e.wantRejected(e.pass(), late, 2, "expired")
		})
	}
}
