package fleet

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/trusttest"
	"github.com/gitfleet/gitfleet/trust"
)

// forgeLedger plays someone who can push to the snapshots branch: an
// unsigned commit on it whose ledger is edit's change of the current one,
// and whose other files are files.
func (e *env) forgeLedger(edit func(l *snapshots.Ledger), files map[string]string) string {
	e.t.Helper()
	l := e.ledger()
	edit(l)
	data, err := l.Marshal()
	if err != nil {
		e.t.Fatal(err)
	}
	w := map[string]string{snapshots.LedgerPath: string(data)}
	for p, c := range files {
		w[p] = c
	}
	return e.commit(gittest.Edit{Branch: DefaultSnapshotsBranch, Write: w, Message: "forged"})
}

// evilRetained is a forged retained record: a VM the desired branch never
// held, with a spec that reads a host file.
func evilRetained(from desired.Hash) *snapshots.RetainedRecord {
	spec := desired.VMSpec{Host: "hv-a", VCPUs: 1, MemoryMB: 256}
	return &snapshots.RetainedRecord{Kind: desired.KindVM, Name: "evil", Host: "hv-a", Spec: &spec, Commit: from, From: from}
}

// signingController is a controller over e's repository signing with
// key, trusting the snapshots commits of more as well, and adopting the
// unsigned ledger of the snapshots commit trustOnce ("": none).
func (e *env) signingController(key trusttest.SSHKey, trustOnce string, more ...trusttest.SSHKey) (*Controller, error) {
	e.t.Helper()
	signer, err := trust.LoadCommitSigner(key.Private)
	if err != nil {
		e.t.Fatal(err)
	}
	var others []trust.SSHSigner
	for _, k := range more {
		s, err := trust.ParseKeys("test", []string{k.Public})
		if err != nil {
			e.t.Fatal(err)
		}
		others = append(others, s...)
	}
	return New(Config{URL: e.url, Clock: e.clock.Now, Logger: quietLogger(), SummaryInterval: -1,
		SigningKey: signer, ControllerKeys: others, TrustUnsignedLedgerOnce: trustOnce})
}

// signedBy reports whether the snapshots tip is signed by key.
func (e *env) signedBy(key trusttest.SSHKey) bool {
	e.t.Helper()
	return e.signedAt(DefaultSnapshotsBranch, key)
}

// newSigningEnv is newEnv(t, baseFleet()) with a controller signing with a
// new key, after its first pass.
func newSigningEnv(t *testing.T) (*env, trusttest.SSHKey) {
	t.Helper()
	key := trusttest.NewSSHKey(t, "gitfleet-controller")
	e := newEnv(t, baseFleet())
	c, err := e.signingController(key, "")
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	e.pass()
	return e, key
}

// wantForged checks that res and the ledger report a forgery whose reason
// holds want.
func (e *env) wantForged(res PassResult, want string) {
	e.t.Helper()
	found := false
	for _, f := range res.ForgedCommits {
		found = found || strings.Contains(f.Reason, want)
	}
	if !found {
		e.t.Errorf("forged commits %+v: none names %q", res.ForgedCommits, want)
	}
	found = false
	for _, f := range e.ledger().ForgedCommits {
		found = found || strings.Contains(f.Reason, want)
	}
	if !found {
		e.t.Errorf("ledger forgedCommits %+v: none names %q", e.ledger().ForgedCommits, want)
	}
}

// Without a signing key, a retained record the desired branch's history
// does not justify is never published: a name the commit it names never
// held, a record naming no commit, a revision instead of a commit. Every
// host is still published, and the forgery is reported.
func TestForgedRetainedRecordNotPublished(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		from       func(applied desired.Hash) desired.Hash
	}{
		{"never in the named commit", "does not hold it", func(a desired.Hash) desired.Hash { return a }},
		{"no commit named", "names no commit", func(desired.Hash) desired.Hash { return "" }},
		{"a revision, not a commit", "not in the desired branch's history", func(desired.Hash) desired.Hash { return "HEAD" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, baseFleet())
			e.pass()
			applied := e.ledger().Applied.Commit
			e.forgeLedger(func(l *snapshots.Ledger) {
				l.Retained = append(l.Retained, evilRetained(tc.from(applied)))
			}, nil)
			res := e.pass()
			if vm := e.snapshot("hv-a").VM("evil"); vm != nil {
				t.Fatalf("forged retained VM published: %+v", vm)
			}
			if e.snapshot("hv-a").VM("web-01") == nil || e.snapshot("hv-b").VM("db-01") == nil {
				t.Fatal("the desired VMs should stay published")
			}
			if len(e.ledger().Retained) != 0 || res.RetainedTotal != 0 {
				t.Fatalf("retained = %+v, want the forged record dropped", e.ledger().Retained)
			}
			e.wantForged(res, "evil")
			e.wantForged(res, tc.want)
			if got := metricValue(t, e.c, "gitfleet_controller_forged_snapshots_commits_total"); got < 1 {
				t.Errorf("gitfleet_controller_forged_snapshots_commits_total = %v", got)
			}
		})
	}
}

// A retained record whose spec differs from the one its commit gave the
// VM is not published either.
func TestForgedRetainedSpecNotPublished(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	applied := e.ledger().Applied.Commit
	// Drop web-01 from the desired state by review, then forge it back
	// in as retained with more memory.
	e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}, Message: "retire web-01"})
	e.pass()
	e.forgeLedger(func(l *snapshots.Ledger) {
		r := evilRetained(applied)
		r.Name, r.Spec.MemoryMB = "web-01", 65536
		l.Retained = append(l.Retained, r)
		l.Tombstones = nil
	}, nil)
	res := e.pass()
	if vm := e.snapshot("hv-a").VM("web-01"); vm != nil && !vm.Tombstoned {
		t.Fatalf("web-01 published live from a forged record: %+v", vm)
	}
	e.wantForged(res, "its spec is not the one")
}

// Without a signing key, names the ledger lists for a host that the
// applied commit never held there are not tombstoned.
func TestForgedLedgerNamesNotTombstoned(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	e.forgeLedger(func(l *snapshots.Ledger) {
		l.Hosts["hv-a"].VMs = append(l.Hosts["hv-a"].VMs, "ghost")
		l.Hosts["hv-b"].Volumes = append(l.Hosts["hv-b"].Volumes, "ghost-data")
	}, nil)
	res := e.pass()
	if len(res.Tombstoned) != 0 || len(e.ledger().Tombstones) != 0 {
		t.Fatalf("tombstoned %v from forged ledger names", res.Tombstoned)
	}
	if e.snapshot("hv-a").VM("ghost") != nil {
		t.Fatal("ghost is in hv-a's snapshot")
	}
	e.wantForged(res, "VM ghost@hv-a")
	e.wantForged(res, "Volume ghost-data@hv-b")
	// A reviewed delete is still tombstoned.
	e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}, Message: "retire web-01"})
	if res := e.pass(); len(res.Tombstoned) != 1 || res.Tombstoned[0] != "VM web-01@hv-a" {
		t.Fatalf("tombstoned = %v, want web-01", res.Tombstoned)
	}
}

// With a signing key, a forged ledger on top of a signed one is never
// read: the controller acts on the signed commit's ledger, writes over the
// forgery (republishing the host file it changed), and reports it.
func TestForgedLedgerOverSignedOneRepaired(t *testing.T) {
	e, key := newSigningEnv(t)
	signed := e.snapshotsTip()
	epoch := e.snapshot("hv-a").Epoch
	forged := e.forgeLedger(func(l *snapshots.Ledger) {
		l.Retained = append(l.Retained, evilRetained(l.Applied.Commit))
		l.Hosts["hv-b"].VMs = append(l.Hosts["hv-b"].VMs, "ghost")
		l.Hosts["hv-a"].Epoch += 1000
	}, map[string]string{snapshots.Path("hv-a"): "host: hv-a\nepoch: 99999\nvms: []\nvolumes: []\n"})
	res := e.pass()
	if len(res.ForgedCommits) != 1 || res.ForgedCommits[0].Commit != forged || res.ForgedCommits[0].Signed != signed {
		t.Fatalf("forged commits = %+v, want %s above %s", res.ForgedCommits, forged, signed)
	}
	if e.snapshot("hv-a").VM("evil") != nil || e.snapshot("hv-a").VM("web-01") == nil {
		t.Fatalf("hv-a = %+v, want web-01 and no forged VM", e.snapshot("hv-a"))
	}
	if got := e.snapshot("hv-a").Epoch; got != epoch+1 {
		t.Errorf("hv-a repaired at epoch %d, want %d (the signed ledger's next)", got, epoch+1)
	}
	if l := e.ledger(); len(l.Retained) != 0 || len(l.Tombstones) != 0 || len(res.Tombstoned) != 0 {
		t.Fatalf("ledger retained %+v tombstones %+v: the forged ledger was acted on", l.Retained, l.Tombstones)
	}
	if !e.signedBy(key) {
		t.Fatal("the snapshots tip after the repair is not signed")
	}
	e.wantForged(res, "carries no signature")
	if got := metricValue(t, e.c, "gitfleet_controller_forged_snapshots_commits_total"); got != 1 {
		t.Errorf("gitfleet_controller_forged_snapshots_commits_total = %v, want 1", got)
	}
	if res := e.pass(); len(res.ForgedCommits) != 0 {
		t.Fatalf("a pass over the repaired tip reports %+v", res.ForgedCommits)
	}
	// README.md on the status branch lists it.
	readme := gittest.Show(t, e.dir, "refs/heads/"+DefaultStatusBranch, status.SummaryPath)
	if !strings.Contains(readme, "## Forged snapshots commits") || !strings.Contains(readme, desired.Hash(forged).Short()) {
		t.Errorf("README.md lacks the forged commit:\n%s", readme)
	}
}

// A controller given a signing key over a snapshots branch that no
// controller key signed refuses to publish, naming the one-time trust
// option; with it, it adopts the ledger once and signs; from then on an
// unsigned commit on top is not adopted.
func TestUnsignedLedgerNeedsExplicitTrust(t *testing.T) {
	key := trusttest.NewSSHKey(t, "gitfleet-controller")
	e := newEnv(t, baseFleet())
	e.pass() // unsigned, as before keys were configured
	tip := e.snapshotsTip()

	c, err := e.signingController(key, "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Pass(context.Background())
	if !errors.Is(err, ErrUnsignedLedger) || !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), TrustUnsignedLedgerOnceFlag+"="+tip) {
		t.Fatalf("pass error = %v, want ErrUnsignedLedger naming %s=%s", err, TrustUnsignedLedgerOnceFlag, tip)
	}
	if e.snapshotsTip() != tip {
		t.Fatal("a refused pass wrote to the snapshots branch")
	}

	// The person checked tip; before the restart someone pushed another
	// commit on top. It is not adopted, and the refusal names both.
	forged := e.forgeLedger(func(*snapshots.Ledger) {}, map[string]string{"note.txt": "pushed after the check\n"})
	if c, err = e.signingController(key, tip); err != nil {
		t.Fatal(err)
	}
	_, err = c.Pass(context.Background())
	if !errors.Is(err, ErrUnsignedLedger) || !strings.Contains(err.Error(), tip) || !strings.Contains(err.Error(), forged) {
		t.Fatalf("pass error = %v, want ErrUnsignedLedger naming the checked %s and the tip %s", err, tip, forged)
	}
	if e.snapshotsTip() != forged {
		t.Fatal("a refused pass wrote to the snapshots branch")
	}
	for _, bad := range []string{tip[:7], tip[:12], "true", "HEAD"} {
		if _, err := e.signingController(key, bad); !errors.Is(err, ErrConfig) {
			t.Errorf("%s=%s: New error = %v, want ErrConfig (a full hash only)", TrustUnsignedLedgerOnceFlag, bad, err)
		}
	}

	// Checked again, at the new tip: adopted.
	if e.c, err = e.signingController(key, forged); err != nil {
		t.Fatal(err)
	}
	e.pass()
	if l := e.ledger(); l.Adopted == nil || string(l.Adopted.Commit) != forged {
		t.Fatalf("ledger adopted = %+v, want %s", l.Adopted, forged)
	}
	if !e.signedBy(key) {
		t.Fatal("the adopted ledger was not written over, signed")
	}
	e.forgeLedger(func(l *snapshots.Ledger) { l.Retained = append(l.Retained, evilRetained(l.Applied.Commit)) }, nil)
	res := e.pass()
	if len(res.ForgedCommits) != 1 || e.snapshot("hv-a").VM("evil") != nil {
		t.Fatalf("forged %+v, hv-a %+v: the once-option adopted a second unsigned ledger", res.ForgedCommits, e.snapshot("hv-a"))
	}
}

// A tip that holds no ledger is no controller's commit: named for the
// one-time adoption, it is refused, since adopting it would start from an
// empty ledger and drop every pending delete.
func TestAdoptionRefusesATipWithoutALedger(t *testing.T) {
	key := trusttest.NewSSHKey(t, "gitfleet-controller")
	e := newEnv(t, baseFleet())
	e.pass() // unsigned, as before keys were configured
	bare := gittest.Commit(t, e.dir, gittest.Edit{Branch: DefaultSnapshotsBranch, Remove: []string{snapshots.LedgerPath}, Message: "no ledger"})
	c, err := e.signingController(key, bare)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Pass(context.Background())
	if !errors.Is(err, ErrUnsignedLedger) || !strings.Contains(err.Error(), "holds no "+snapshots.LedgerPath) {
		t.Fatalf("pass error = %v, want ErrUnsignedLedger saying the tip holds no ledger", err)
	}
	if e.snapshotsTip() != bare {
		t.Fatal("a refused pass wrote to the snapshots branch")
	}
}

// A controller whose key rotated trusts the commits of the old key when
// it is listed among the controller keys, and refuses them when not.
func TestLedgerKeyRotation(t *testing.T) {
	old := trusttest.NewSSHKey(t, "controller-2025")
	next := trusttest.NewSSHKey(t, "controller-2026")
	e := newEnv(t, baseFleet())
	c, err := e.signingController(old, "")
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	e.pass()

	unlisted, err := e.signingController(next, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unlisted.Pass(context.Background()); !errors.Is(err, ErrUnsignedLedger) {
		t.Fatalf("old key not listed: pass error = %v, want ErrUnsignedLedger", err)
	}

	if e.c, err = e.signingController(next, "", old); err != nil {
		t.Fatal(err)
	}
	e.commit(editWeb(3, nil))
	res := e.pass()
	if len(res.ForgedCommits) != 0 || res.Published["hv-a"] == 0 {
		t.Fatalf("rotated controller: %+v", res)
	}
	if !e.signedBy(next) {
		t.Fatal("the new tip is not signed with the new key")
	}
}

// Without a signing key, a controller whose clone no longer holds the
// commit a retained record names (a fresh clone after the rewrite) keeps
// publishing it only while its host reports it exactly as recorded:
// publishing it then changes nothing on the host.
func TestRetainedAfterFreshCloneNeedsTheHostsReport(t *testing.T) {
	for _, reported := range []bool{true, false} {
		t.Run(map[bool]string{true: "host reports it", false: "host does not"}[reported], func(t *testing.T) {
			e := newEnv(t, baseFleet())
			e.pass()
			orphan := e.commit(gittest.Edit{Branch: "orphan", Message: "Initial", Write: map[string]string{
				"hosts/hv-a.yaml": hostYAML("hv-a"), "hosts/hv-b.yaml": hostYAML("hv-b"),
				"vms/web-01.yaml": vmYAML("web-01", "hv-a", 2)}})
			gittest.SetBranch(t, e.dir, "main", orphan)
			if res := e.pass(); res.RetainedTotal != 2 {
				t.Fatalf("rewrite: %+v, want db-01 and db-data retained", res)
			}
			if reported {
				var spec desired.VMSpec
				for _, k := range e.ledger().Retained {
					if k.Kind == desired.KindVM {
						spec = *k.Spec
					}
				}
				writeStatus(t, e.url, &status.Status{Host: "hv-b", Heartbeat: 1, LastSeenEpoch: e.snapshot("hv-b").Epoch,
					VMs:     []status.VM{{Name: "db-01", Phase: "ready", Power: "running", SpecHash: desired.SpecHash(spec)}},
					Volumes: []status.Volume{{Name: "db-data", Present: true, SizeGB: 50}}})
			}
			e.c = e.newController() // its clone lacks the commit before the rewrite
			res := e.pass()
			vm := e.snapshot("hv-b").VM("db-01")
			if reported {
				if vm == nil || res.RetainedTotal != 2 || len(res.ForgedCommits) != 0 {
					t.Fatalf("db-01 %+v, retained %d, forged %+v: the host's report should keep it", vm, res.RetainedTotal, res.ForgedCommits)
				}
				return
			}
			if vm != nil || res.RetainedTotal != 0 {
				t.Fatalf("db-01 %+v, retained %d: published without a witness", vm, res.RetainedTotal)
			}
			e.wantForged(res, "does not report it")
		})
	}
}

// Without a signing key, a pending tombstone the ledger lists is published
// only when its commit removed the object in the desired branch's
// history: a forged one (naming a live VM, or a commit that removed
// something else) is never delivered, while a reviewed delete stays
// pending.
func TestForgedTombstoneRecordNotPublished(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	retire := e.commit(gittest.Edit{Remove: []string{"vms/db-01.yaml"}, Message: "retire db-01"})
	if res := e.pass(); len(res.Tombstoned) != 1 {
		t.Fatalf("tombstoned = %v", res.Tombstoned)
	}
	e.forgeLedger(func(l *snapshots.Ledger) {
		// Not a live VM (that would be un-deleted at once): a VM the
		// agent runs but the desired state never named, and db-data
		// attributed to the commit that removed db-01.
		l.Tombstones = append(l.Tombstones,
			&snapshots.TombstoneRecord{Kind: desired.KindVM, Name: "ghost", Host: "hv-a", Tombstone: snapshots.Tombstone{Commit: desired.Hash(retire), Epoch: 1}},
			&snapshots.TombstoneRecord{Kind: desired.KindVolume, Name: "other", Host: "hv-b", Tombstone: snapshots.Tombstone{Commit: desired.Hash(retire), Epoch: 1}})
	}, nil)
	res := e.pass()
	if e.snapshot("hv-a").VM("ghost") != nil {
		t.Fatal("the forged tombstone was published")
	}
	if vm := e.snapshot("hv-b").VM("db-01"); vm == nil || !vm.Tombstoned || res.Pending != 1 {
		t.Fatalf("db-01 = %+v, pending %d: the reviewed delete should stay pending", vm, res.Pending)
	}
	e.wantForged(res, "tombstone of VM ghost@hv-a")
	e.wantForged(res, "tombstone of Volume other@hv-b")
}

// A forged snapshots commit is never signed into acceptance by a pass
// that writes only the ledger: with the desired state rejected, every
// path the forged commit changed (a host file at a higher epoch with a
// tombstone, a file it added) is restored to the signed commit's content
// in the controller's signed commit on top. Agents check only the tip's
// signature, so without the restore they accepted the forged file.
func TestForgedHostFileRestoredWhenTheDesiredStateIsRejected(t *testing.T) {
	e, key := newSigningEnv(t)
	signed := e.snapshotsTip()
	genuine := gittest.Show(t, e.dir, signed, snapshots.Path("hv-a"))
	forgedFile := "host: hv-a\nepoch: 50\nvms: []\nvolumes: []\ntombstones: [{kind: VM, name: web-01, epoch: 50}]\n"
	e.commit(gittest.Edit{Branch: DefaultSnapshotsBranch, Message: "forged",
		Write: map[string]string{snapshots.Path("hv-a"): forgedFile, "extra.yaml": "planted: true\n"}})
	head := e.commitBroken()

	res := e.pass()
	if res.Rejected == nil || len(res.ForgedCommits) != 1 {
		t.Fatalf("rejected %v, forged %+v: want %s rejected and the forged commit reported", res.Rejected, res.ForgedCommits, desired.Hash(head).Short())
	}
	if !e.signedBy(key) {
		t.Fatal("the tip after the pass is not the controller's signed commit")
	}
	tip := e.snapshotsTip()
	if got := gittest.Show(t, e.dir, tip, snapshots.Path("hv-a")); got != genuine {
		t.Errorf("the signed tip holds hosts/hv-a.yaml =\n%s\nwant the signed commit's:\n%s", got, genuine)
	}
	if out, err := exec.Command("git", "-C", e.dir, "cat-file", "-e", tip+":extra.yaml").CombinedOutput(); err == nil {
		t.Errorf("the signed tip still holds the forged commit's extra.yaml (%s)", out)
	}
	if l := e.ledger(); l.Rejected == nil || l.Rejected.Commit != desired.Hash(head) {
		t.Errorf("ledger rejected = %+v, want %s", l.Rejected, desired.Hash(head).Short())
	}
}

// forgeDeep plays someone who can push to the snapshots branch and hides
// the signed commits from the controller's walk: a forged commit (a host
// file at a higher epoch with a tombstone of web-01, a planted file, a
// forged retained record in the ledger), on top of the tip or, with
// orphan, in a history of its own, then more unsigned commits on top of
// it. It returns the new tip.
func (e *env) forgeDeep(more int, orphan bool) string {
	e.t.Helper()
	l := e.ledger()
	l.Retained = append(l.Retained, evilRetained(l.Applied.Commit))
	data, err := l.Marshal()
	if err != nil {
		e.t.Fatal(err)
	}
	ed := gittest.Edit{Branch: DefaultSnapshotsBranch, Message: "forged", Write: map[string]string{
		snapshots.LedgerPath:   string(data),
		snapshots.Path("hv-a"): "host: hv-a\nepoch: 50\nvms: []\nvolumes: []\ntombstones: [{kind: VM, name: web-01, epoch: 50}]\n",
		"extra.yaml":           "planted: true\n",
	}}
	if orphan {
		ed.Parents = []string{}
		ed.Write[snapshots.Path("hv-b")] = gittest.Show(e.t, e.dir, e.snapshotsTip(), snapshots.Path("hv-b"))
	}
	tip := e.commit(ed)
	tree := gittest.Git(e.t, e.dir, "rev-parse", tip+"^{tree}")
	for i := 0; i < more; i++ {
		tip = gittest.Git(e.t, e.dir, "-c", "user.name=forger", "-c", "user.email=forger@example.invalid", "commit-tree", tree, "-p", tip, "-m", "forged")
	}
	gittest.SetBranch(e.t, e.dir, DefaultSnapshotsBranch, tip)
	return tip
}

// A running controller over a snapshots branch whose walk reaches no
// signed commit — more than MaxLedgerWalk unsigned commits on top, or a
// history without the signed ones — falls back to the last signed commit
// it wrote: every host is published, the forged host file and the planted
// file are gone from its signed commit on top of the forged tip, the
// forged ledger is not acted on, and the forgery is reported, bounded.
// Before, every pass was refused (ErrUnsignedLedger) until a person came.
func TestDeepOrOrphanForgeryFallsBackToTheLastSignedCommit(t *testing.T) {
	for _, tc := range []struct {
		name   string
		more   int
		orphan bool
		want   string
	}{
		{"more unsigned commits than the walk reads", MaxLedgerWalk, false, "200 and more unsigned commits"},
		{"an orphan history", 2, true, "3 unsigned commits"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, key := newSigningEnv(t)
			signed := e.snapshotsTip()
			forgedTip := e.forgeDeep(tc.more, tc.orphan)

			res := e.pass()
			var atTip *ForgedCommit
			for i, f := range res.ForgedCommits { // oldest first
				if f.Commit == forgedTip {
					atTip = &res.ForgedCommits[i]
				}
			}
			if atTip == nil || atTip.Signed != signed {
				t.Fatalf("forged commits (%d) = %+v: want the tip %s above the last signed %s", len(res.ForgedCommits), atTip, forgedTip, signed)
			}
			if len(res.ForgedCommits) > MaxLedgerWalk {
				t.Errorf("%d forged commits reported, want at most %d", len(res.ForgedCommits), MaxLedgerWalk)
			}
			e.wantForged(res, tc.want)
			if !e.signedBy(key) {
				t.Fatal("the snapshots tip after the pass is not the controller's signed commit")
			}
			tip := e.snapshotsTip()
			if parent := gittest.Rev(t, e.dir, tip+"^"); parent != forgedTip {
				t.Errorf("the signed commit's parent is %s, want the forged tip %s", parent, forgedTip)
			}
			if vm := e.snapshot("hv-a").VM("web-01"); vm == nil || vm.Tombstoned {
				t.Fatalf("hv-a = %+v, want web-01, not tombstoned", e.snapshot("hv-a"))
			}
			if e.snapshot("hv-a").VM("evil") != nil || len(e.ledger().Retained) != 0 || len(e.ledger().Tombstones) != 0 {
				t.Fatalf("hv-a %+v, ledger retained %+v: the forged ledger was acted on", e.snapshot("hv-a"), e.ledger().Retained)
			}
			if e.snapshot("hv-b").VM("db-01") == nil {
				t.Fatal("hv-b lost db-01")
			}
			if out, err := exec.Command("git", "-C", e.dir, "cat-file", "-e", tip+":extra.yaml").CombinedOutput(); err == nil {
				t.Errorf("the signed tip still holds the forged extra.yaml (%s)", out)
			}
			if res := e.pass(); len(res.ForgedCommits) != 0 {
				t.Fatalf("a pass over the repaired tip reports %d forged commits", len(res.ForgedCommits))
			}

			// A restarted controller has no signed commit of its own to
			// fall back to: it refuses, naming the flag with the tip.
			e.forgeDeep(tc.more, tc.orphan)
			fresh, err := e.signingController(key, "")
			if err != nil {
				t.Fatal(err)
			}
			_, err = fresh.Pass(context.Background())
			if !errors.Is(err, ErrUnsignedLedger) || !strings.Contains(err.Error(), TrustUnsignedLedgerOnceFlag+"="+e.snapshotsTip()) {
				t.Fatalf("restarted controller: pass error = %v, want ErrUnsignedLedger naming %s=<tip>", err, TrustUnsignedLedgerOnceFlag)
			}
			// It has no summary of its own yet, but it records the
			// refusal on the status branch: the last view there must
			// not read as a healthy fleet, nor, later, as a stopped
			// controller.
			rec := gittest.Show(t, e.dir, "refs/heads/"+DefaultStatusBranch, status.ControllerPath)
			if !strings.Contains(rec, string(OutcomeRefused)) || !strings.Contains(rec, TrustUnsignedLedgerOnceFlag) {
				t.Fatalf("restarted controller: %s on the status branch:\n%s\nwant the refusal", status.ControllerPath, rec)
			}
			if gittest.Show(t, e.dir, "refs/heads/"+DefaultStatusBranch, status.LastWritePath) == "" {
				t.Fatalf("restarted controller: no %s", status.LastWritePath)
			}
		})
	}
}

// The fallback reads the last signed commit from the controller's own
// copy of the snapshots branch; when that copy no longer holds it, the
// pass is refused and says so.
func TestDeepForgeryRefusedWhenTheLastSignedCommitIsGone(t *testing.T) {
	e, _ := newSigningEnv(t)
	e.forgeDeep(MaxLedgerWalk, false)
	// A commit the tip repository never fetched (the desired branch's).
	e.c.lastSigned.commit = gittest.Rev(t, e.dir, "refs/heads/main")
	tip := e.snapshotsTip()
	_, err := e.c.Pass(context.Background())
	if !errors.Is(err, ErrUnsignedLedger) || !strings.Contains(err.Error(), "no longer in its local copy") {
		t.Fatalf("pass error = %v, want ErrUnsignedLedger saying the last signed commit is gone", err)
	}
	if e.snapshotsTip() != tip {
		t.Fatal("a refused pass wrote to the snapshots branch")
	}
}
