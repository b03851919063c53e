package fleet

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/trusttest"
	"github.com/gitfleet/gitfleet/trust"
)

// newVerifyingEnv is newEnv whose controller verifies signatures in mode
// against signers; the initial fleet is committed signed with sign.
func newVerifyingEnv(t *testing.T, mode VerifyMode, signers *trust.Signers, sign *gittest.Signing) *env {
	t.Helper()
	e := newEnv(t, nil)
	e.commit(gittest.Edit{Write: baseFleet(), Message: "initial fleet", Sign: sign})
	c, err := New(Config{URL: e.url, Clock: e.clock.Now, Logger: quietLogger(), SummaryInterval: -1, Verify: mode, Signers: signers})
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	return e
}

func sshAllowed(t *testing.T, keys ...trusttest.SSHKey) *trust.Signers {
	t.Helper()
	var lines string
	for i, k := range keys {
		lines += k.AllowedSigner(fmt.Sprintf("person%d@example.com", i))
	}
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

// editWeb changes web-01's vCPUs: a change of hv-a only.
func editWeb(vcpus int, sign *gittest.Signing) gittest.Edit {
	return gittest.Edit{Write: map[string]string{"vms/web-01.yaml": vmYAML("web-01", "hv-a", vcpus)}, Sign: sign,
		Message: fmt.Sprintf("web-01: %d vCPUs", vcpus)}
}

// wantRejected checks that the pass rejected head for its signature with
// a reason holding each of want, recorded in the ledger, and that hv-a's
// snapshot is still the last good one (web-01 at vcpus).
func (e *env) wantRejected(res PassResult, head string, vcpus int, want ...string) {
	e.t.Helper()
	if !errors.Is(res.Rejected, trust.ErrSignature) {
		e.t.Fatalf("rejected = %v, want a signature refusal", res.Rejected)
	}
	l := e.ledger()
	if l.Rejected == nil || l.Rejected.Commit != desired.Hash(head) {
		e.t.Fatalf("ledger rejection = %+v, want commit %s", l.Rejected, head)
	}
	for _, w := range want {
		if !strings.Contains(l.Rejected.Reason, w) {
			e.t.Errorf("reason %q lacks %q", l.Rejected.Reason, w)
		}
	}
	if got := e.snapshot("hv-a").VM("web-01").Spec.VCPUs; got != vcpus {
		e.t.Fatalf("web-01 has %d vCPUs in its snapshot, want the last good %d", got, vcpus)
	}
	if PassOutcome(res, nil) != OutcomeRejected {
		e.t.Fatalf("outcome %s", PassOutcome(res, nil))
	}
}

func TestSignedDesiredStateSSH(t *testing.T) {
	ann := trusttest.NewSSHKey(t, "ann")
	eve := trusttest.NewSSHKey(t, "eve")
	e := newVerifyingEnv(t, VerifyHead, sshAllowed(t, ann), ann.Sign())
	if res := e.pass(); res.Rejected != nil || res.Published["hv-a"] != 1 {
		t.Fatalf("signed initial fleet: %+v", res)
	}
	e.commit(editWeb(3, ann.Sign()))
	if res := e.pass(); res.Rejected != nil || res.Published["hv-a"] != 2 {
		t.Fatalf("signed by an allowed key: %+v", res)
	}

	unsigned := e.commit(editWeb(4, nil))
	e.wantRejected(e.pass(), unsigned, 3, desired.Hash(unsigned).Short(), "carries no signature")

	byEve := e.commit(editWeb(5, eve.Sign()))
	e.wantRejected(e.pass(), byEve, 3, desired.Hash(byEve).Short(), "SHA256:", "not on the allowed-signers list")

	e.commit(editWeb(6, ann.Sign()))
	res := e.pass()
	if res.Rejected != nil || res.Published["hv-a"] != 3 || e.snapshot("hv-a").VM("web-01").Spec.VCPUs != 6 {
		t.Fatalf("signed again: %+v", res)
	}
	if l := e.ledger(); l.Rejected == nil || l.Rejected.Superseded == "" {
		t.Fatalf("the rejection should be superseded: %+v", l.Rejected)
	}
}

func TestSignedDesiredStateOpenPGP(t *testing.T) {
	// The keys are made, and sign, before the controller's clock reads:
	// a key is valid from when it was made.
	made := newEnv(t, nil).clock.Now().Add(-24 * time.Hour)
	ann := trusttest.NewGPGKeyAt(t, "Ann <ann@example.com>", made, "never")
	eve := trusttest.NewGPGKeyAt(t, "Eve <eve@example.com>", made, "never")
	at := made.Add(time.Hour)
	kr, err := trust.ParseKeyring("keyring.asc", []byte(ann.Armored))
	if err != nil {
		t.Fatal(err)
	}
	signers, err := trust.New(nil, kr)
	if err != nil {
		t.Fatal(err)
	}
	e := newVerifyingEnv(t, VerifyHead, signers, ann.SignAt(at))
	if res := e.pass(); res.Rejected != nil {
		t.Fatalf("signed initial fleet: %v", res.Rejected)
	}
	byEve := e.commit(editWeb(3, eve.SignAt(at)))
	e.wantRejected(e.pass(), byEve, 2, desired.Hash(byEve).Short(), eve.Fingerprint, "not in the keyring")
	unsigned := e.commit(editWeb(4, nil))
	e.wantRejected(e.pass(), unsigned, 2, "carries no signature")
	e.commit(editWeb(5, ann.SignAt(at)))
	if res := e.pass(); res.Rejected != nil || e.snapshot("hv-a").VM("web-01").Spec.VCPUs != 5 {
		t.Fatalf("signed by the keyring's key: %+v", res)
	}
}

// In every mode each first-parent commit since the applied one must be
// signed: a signed commit followed by an unsigned one, or an unsigned one
// under a signed head (a direct push a signed merge then covers), is
// rejected; in head mode only the head counts.
func TestSignedDesiredStateEveryCommit(t *testing.T) {
	ann := trusttest.NewSSHKey(t, "ann")
	allowed := sshAllowed(t, ann)
	e := newVerifyingEnv(t, VerifyEvery, allowed, ann.Sign())
	e.pass()

	e.commit(editWeb(3, ann.Sign()))
	unsignedHead := e.commit(editWeb(4, nil))
	e.wantRejected(e.pass(), unsignedHead, 2, "carries no signature")

	// Cover it with a signed commit: the unsigned one is still in the range.
	signedHead := e.commit(editWeb(5, ann.Sign()))
	e.wantRejected(e.pass(), signedHead, 2, desired.Hash(unsignedHead).Short(), "below the head")

	// The same history in head mode is applied: only the head is checked.
	head, err := New(Config{URL: e.url, Clock: e.clock.Now, Logger: quietLogger(), SummaryInterval: -1, Verify: VerifyHead, Signers: allowed})
	if err != nil {
		t.Fatal(err)
	}
	e.c = head
	if res := e.pass(); res.Rejected != nil || e.snapshot("hv-a").VM("web-01").Spec.VCPUs != 5 {
		t.Fatalf("head mode over a signed head: %+v", res)
	}
	// Back in every mode, the range starts at the applied commit: new
	// signed commits pass.
	every, err := New(Config{URL: e.url, Clock: e.clock.Now, Logger: quietLogger(), SummaryInterval: -1, Verify: VerifyEvery, Signers: allowed})
	if err != nil {
		t.Fatal(err)
	}
	e.c = every
	e.commit(editWeb(6, ann.Sign()))
	e.commit(editWeb(7, ann.Sign()))
	if res := e.pass(); res.Rejected != nil || e.snapshot("hv-a").VM("web-01").Spec.VCPUs != 7 {
		t.Fatalf("every mode over signed commits: %+v", res)
	}
}

func TestVerifyNeedsSigners(t *testing.T) {
	_, err := New(Config{URL: "/nonexistent", Verify: VerifyEvery})
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("err = %v, want ErrConfig", err)
	}
	if _, err := New(Config{URL: "/nonexistent", Verify: "sometimes"}); !errors.Is(err, ErrConfig) {
		t.Fatalf("err = %v, want ErrConfig for an unknown mode", err)
	}
}

// Deleting 50 VM files in one commit is rejected, naming the trailer and
// the count; a commit carrying the trailer lets all 50 be tombstoned.
func TestMassDeleteNeedsTrailer(t *testing.T) {
	files := baseFleet()
	files["hosts/hv-a.yaml"] = strings.Replace(hostYAML("hv-a"), "vcpus: 32", "vcpus: 64", 1)
	var names []string
	for i := range 50 {
		n := fmt.Sprintf("batch-%02d", i)
		names = append(names, "vms/"+n+".yaml")
		files["vms/"+n+".yaml"] = vmYAML(n, "hv-a", 1)
	}
	e := newEnv(t, files)
	if res := e.pass(); res.Rejected != nil || len(e.snapshot("hv-a").VMs) != 51 {
		t.Fatalf("first pass: %v", res.Rejected)
	}
	del := e.commit(gittest.Edit{Remove: names, Message: "git rm -r by mistake"})
	res := e.pass()
	if !errors.Is(res.Rejected, ErrMassDelete) {
		t.Fatalf("rejected = %v, want the mass-delete guard (%+v)", res.Rejected, res)
	}
	for _, w := range []string{"Gitfleet-Allow-Deletes: 50", "50 object(s)", "more than --max-deletes 10", "of host hv-a's 51 VMs"} {
		if !strings.Contains(res.Rejected.Error(), w) {
			t.Errorf("rejection %q lacks %q", res.Rejected, w)
		}
	}
	if l := e.ledger(); l.Rejected == nil || l.Rejected.Commit != desired.Hash(del) || len(l.Tombstones) != 0 {
		t.Fatalf("ledger = %+v", l)
	}
	if n := len(e.snapshot("hv-a").VMs); n != 51 {
		t.Fatalf("hv-a's snapshot has %d VMs, want the last good 51", n)
	}

	e.commit(gittest.Edit{Message: "Allow the batch delete\n\nGitfleet-Allow-Deletes: 50\n"})
	res = e.pass()
	if res.Rejected != nil || len(res.Tombstoned) != 50 {
		t.Fatalf("with the trailer: rejected %v, tombstoned %d", res.Rejected, len(res.Tombstoned))
	}
	tombstoned := 0
	for _, vm := range e.snapshot("hv-a").VMs {
		if vm.Tombstoned {
			tombstoned++
			if vm.Tombstone.Commit != desired.Hash(del) {
				t.Errorf("%s attributed to %s, want the deleting commit", vm.Name, vm.Tombstone.Commit)
			}
		}
	}
	if tombstoned != 50 {
		t.Fatalf("%d tombstones in hv-a's snapshot, want 50", tombstoned)
	}
}

// pushSnapshots rewrites files of the snapshots branch as anyone who can
// push to it could.
func pushSnapshots(t *testing.T, url string, edit func(read func(string) ([]byte, error)) map[string][]byte) {
	t.Helper()
	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: url, Logger: quietLogger(), Committer: "mallory <m@example.com>"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = repo.Update(context.Background(), DefaultSnapshotsBranch, func(_ string, read func(string) ([]byte, error)) (map[string][]byte, string, error) {
		return edit(read), "forged", nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A forged tombstone in a host's snapshot, with the ledger's record of the
// published file (hosts[h].file) forged to match it, is repaired by a
// running controller: it compares the file with the snapshot it computes,
// never with the ledger's own word. The other host's file is untouched.
func TestForgedTombstoneWithForgedLedgerRepaired(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	hvB := gittest.Show(t, e.dir, "refs/heads/"+DefaultSnapshotsBranch, snapshots.Path("hv-b"))
	pushSnapshots(t, e.url, func(read func(string) ([]byte, error)) map[string][]byte {
		data, err := read(snapshots.Path("hv-a"))
		if err != nil {
			t.Fatal(err)
		}
		s, err := snapshots.ParseSnapshot(data)
		if err != nil {
			t.Fatal(err)
		}
		s.Epoch++
		vm := &s.VMs[0]
		vm.Tombstoned = true
		vm.Tombstone = &snapshots.Tombstone{Commit: "0000000000000000000000000000000000000000", Author: "mallory", Time: "2026-11-30T03:00:00Z", Epoch: s.Epoch}
		forged, err := snapshots.MarshalSnapshot(s)
		if err != nil {
			t.Fatal(err)
		}
		ld, err := read(snapshots.LedgerPath)
		if err != nil {
			t.Fatal(err)
		}
		l, err := snapshots.ParseLedger(ld)
		if err != nil {
			t.Fatal(err)
		}
		l.Hosts["hv-a"].Epoch = s.Epoch
		l.Hosts["hv-a"].File = fileHash(forged)
		ledger, err := l.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return map[string][]byte{snapshots.Path("hv-a"): forged, snapshots.LedgerPath: ledger}
	})
	if !e.snapshot("hv-a").VM("web-01").Tombstoned {
		t.Fatal("the forgery did not land")
	}
	res := e.pass()
	if len(res.Repaired) != 1 || res.Repaired[0] != "hv-a" || res.Published["hv-a"] != 3 {
		t.Fatalf("result = %+v, want hv-a repaired at epoch 3", res)
	}
	if e.snapshot("hv-a").VM("web-01").Tombstoned {
		t.Fatal("the forged tombstone is still published")
	}
	if got := gittest.Show(t, e.dir, "refs/heads/"+DefaultSnapshotsBranch, snapshots.Path("hv-b")); got != hvB {
		t.Fatal("hv-b's snapshot changed")
	}
	// Repaired once: the next pass on the controller's own tip is quiet.
	if res := e.pass(); res.Changed() {
		t.Fatalf("second pass republished: %+v", res)
	}
}

// A status file for a host that does not exist, with a huge
// lastSeenEpoch, is ignored: it stops nobody's publishing and creates no
// ledger record; neither do 2,000 of them.
func TestStatusesOfUnknownHostsIgnored(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	writeStatus(t, e.url, &status.Status{Host: "ghost", Heartbeat: 1, LastSeenEpoch: MaxEpoch - 1})
	e.commit(editWeb(3, nil))
	res := e.pass()
	if res.Published["hv-a"] != 2 || len(res.IgnoredStatuses) != 1 || res.IgnoredStatuses[0] != "ghost" {
		t.Fatalf("result = %+v", res)
	}
	if _, ok := e.ledger().Hosts["ghost"]; ok {
		t.Fatal("a forged status created a ledger record")
	}

	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: e.url, Logger: quietLogger(), Committer: "mallory <m@example.com>"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = repo.Update(context.Background(), DefaultStatusBranch, func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
		files := map[string][]byte{}
		for i := range 2000 {
			st := &status.Status{Host: fmt.Sprintf("forged-%04d", i), Heartbeat: 1, LastSeenEpoch: uint64(1000 + i)}
			data, err := status.Marshal(st)
			if err != nil {
				return nil, "", err
			}
			files[status.Path(st.Host)] = data
		}
		return files, "2000 forged statuses", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	e.commit(editWeb(4, nil))
	res = e.pass()
	if res.Published["hv-a"] != 3 || len(res.IgnoredStatuses) != 2001 || len(res.FenceJumps) != 0 {
		t.Fatalf("published %v, ignored %d, fence jumps %v", res.Published, len(res.IgnoredStatuses), res.FenceJumps)
	}
	if l := e.ledger(); len(l.Hosts) != 2 {
		t.Fatalf("ledger holds %d host records, want hv-a and hv-b only", len(l.Hosts))
	}
	if strings.Contains(e.summary(), "forged-0001") {
		t.Fatal("the summary lists a forged host")
	}
	if got := metricValue(t, e.c, "gitfleet_controller_statuses_ignored"); got != 2001 {
		t.Fatalf("gitfleet_controller_statuses_ignored = %v", got)
	}
}

// AppliedRange is the first-parent commits since the applied one; when the
// first-parent line misses it (reached through a merge's second parent) it
// stops at the first ancestor of it; when the applied commit is not in the
// repository at all (a fresh clone after a force-push) it is the whole
// line.
func TestAppliedRange(t *testing.T) {
	dir := gittest.NewBare(t)
	c1 := gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"a": "1"}})
	c2 := gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"a": "2"}})
	c3 := gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"a": "3"}})
	gittest.SetBranch(t, dir, "side", c1)
	s1 := gittest.Commit(t, dir, gittest.Edit{Branch: "side", Write: map[string]string{"b": "1"}})
	m := gittest.Merge(t, dir, "side", "main", "merge main into side")
	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: dir, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"main", "side"} {
		if _, err := repo.Fetch(context.Background(), b); err != nil {
			t.Fatal(err)
		}
	}
	hashes := func(cs []*gitsource.Commit) string {
		var out []string
		for _, c := range cs {
			out = append(out, c.Hash[:7])
		}
		return strings.Join(out, " ")
	}
	short := func(hs ...string) string {
		var out []string
		for _, h := range hs {
			out = append(out, h[:7])
		}
		return strings.Join(out, " ")
	}
	for _, tc := range []struct {
		name, applied, head, want string
	}{
		{"linear", c1, c3, short(c3, c2)},
		{"nothing applied yet", "", c3, short(c3)},
		{"head is the applied", c3, c3, ""},
		{"applied through a merge's second parent", c3, m, short(m, s1)},
		{"applied not in the repository", strings.Repeat("ab", 20), c3, short(c3, c2, c1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, truncated, err := AppliedRange(repo, tc.applied, tc.head)
			if err != nil || truncated || hashes(got) != tc.want {
				t.Fatalf("range = %q, %v, %v; want %q", hashes(got), truncated, err, tc.want)
			}
		})
	}
	all, err := WithMergedCommits(repo, []*gitsource.Commit{mustInfo(t, repo, m)})
	if err != nil || hashes(all) != short(m, c3, c2) {
		t.Fatalf("merged commits = %q, %v; want the merge and what main brought", hashes(all), err)
	}
}

func mustInfo(t *testing.T, repo *gitsource.Repo, h string) *gitsource.Commit {
	t.Helper()
	c, err := repo.CommitInfo(h)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// forgeApplied pushes a snapshots commit, as anyone who can push to the
// branch could, whose ledger says commit was applied already.
func forgeApplied(t *testing.T, url, commit string) {
	t.Helper()
	pushSnapshots(t, url, func(read func(string) ([]byte, error)) map[string][]byte {
		ld, err := read(snapshots.LedgerPath)
		if err != nil {
			t.Fatal(err)
		}
		l, err := snapshots.ParseLedger(ld)
		if err != nil {
			t.Fatal(err)
		}
		l.Applied.Commit = desired.Hash(commit)
		data, err := l.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return map[string][]byte{snapshots.LedgerPath: data}
	})
}

// The ledger on the snapshots branch is no witness of what was verified:
// a forged ledger naming an unsigned head (or an unsigned commit under a
// signed head) as applied does not make the controller publish it, in
// head or every mode.
func TestForgedAppliedCommitDoesNotSkipVerification(t *testing.T) {
	ann := trusttest.NewSSHKey(t, "ann")
	allowed := sshAllowed(t, ann)
	for _, mode := range []VerifyMode{VerifyHead, VerifyEvery} {
		t.Run(string(mode), func(t *testing.T) {
			e := newVerifyingEnv(t, mode, allowed, ann.Sign())
			if res := e.pass(); res.Rejected != nil {
				t.Fatalf("signed initial fleet: %v", res.Rejected)
			}
			unsigned := e.commit(editWeb(4, nil))
			forgeApplied(t, e.url, unsigned)
			e.wantRejected(e.pass(), unsigned, 2, "carries no signature")
			if mode != VerifyEvery {
				return
			}
			// An unsigned commit a signed head covers: the forged ledger
			// names the unsigned one as applied, so the range is the
			// signed head alone.
			signed := e.commit(editWeb(5, ann.Sign()))
			forgeApplied(t, e.url, unsigned)
			e.wantRejected(e.pass(), signed, 2, desired.Hash(unsigned).Short(), "carries no signature")
		})
	}
}
