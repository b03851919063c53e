package fleet

import (
	"fmt"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/trusttest"
	"github.com/gitfleet/gitfleet/trust"
)

// The ledger walk judges a controller key of --controller-keys (an
// allowed-signers file, with valid-before=) as agents do: at the time the
// controller first saw the snapshots commit. A retired second controller's
// key signs a forged ledger dated before its bound: the commit is forged,
// its ledger is not acted on, and the controller repairs over it.
func TestRetiredControllerKeyBackdatedLedgerIsForged(t *testing.T) {
	mine := trusttest.NewSSHKey(t, "gitfleet-controller")
	retired := trusttest.NewSSHKey(t, "gitfleet-controller-2025")
	e := newEnv(t, baseFleet())
	now := e.clock.Now()
	others, err := trust.ParseAllowedSigners("controller_keys", []byte(fmt.Sprintf("old valid-before=%q %s\n",
		now.Add(-24*time.Hour).UTC().Format("20060102150405")+"Z", retired.Public)))
	if err != nil {
		t.Fatal(err)
	}
	signer, err := trust.LoadCommitSigner(mine.Private)
	if err != nil {
		t.Fatal(err)
	}
	e.c, err = New(Config{URL: e.url, Clock: e.clock.Now, Logger: quietLogger(), SummaryInterval: -1, SigningKey: signer, ControllerKeys: others})
	if err != nil {
		t.Fatal(err)
	}
	e.pass()
	signed := e.snapshotsTip()
	l := e.ledger()
	l.Hosts["hv-b"].VMs = append(l.Hosts["hv-b"].VMs, "db-01", "ghost")
	l.Retained = append(l.Retained, evilRetained(l.Applied.Commit))
	data, err := l.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	forged := e.commit(gittest.Edit{Branch: DefaultSnapshotsBranch, Message: "snapshots", Time: now.Add(-72 * time.Hour),
		Write: map[string]string{snapshots.LedgerPath: string(data)}, Sign: retired.Sign()})
	res := e.pass()
	if len(res.ForgedCommits) != 1 || res.ForgedCommits[0].Commit != forged || res.ForgedCommits[0].Signed != signed {
		t.Fatalf("forged commits = %+v, want %s above %s", res.ForgedCommits, forged, signed)
	}
	if e.snapshot("hv-a").VM("evil") != nil || len(res.Tombstoned) != 0 {
		t.Fatalf("the retired key's ledger was acted on: hv-a %+v, tombstoned %v", e.snapshot("hv-a"), res.Tombstoned)
	}
	e.wantForged(res, "expired")
}
