package fleet

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// webProfile is a profile of the VMs of profiledFleet; memoryMB varies.
func webProfile(memoryMB int) string {
	return fmt.Sprintf(`apiVersion: gitfleet.dev/v1alpha1
kind: Profile
metadata: {name: web}
spec:
  vcpus: 1
  memoryMB: %d
  diskGB: 2
  image:
    url: https://example.com/debian.qcow2
    sha256: %s
  cloudInit:
    userData: |
      #cloud-config
      packages: [nginx]
`, memoryMB, imageSHA)
}

// profiledFleet is 20 VMs on hosts hv-a and hv-b: each VM's file names
// profile web, or, written out, holds what the profile would give it.
func profiledFleet(writtenOut bool) map[string]string {
	files := map[string]string{"hosts/hv-a.yaml": hostYAML("hv-a"), "hosts/hv-b.yaml": hostYAML("hv-b")}
	if !writtenOut {
		files["profiles/web.yaml"] = webProfile(512)
	}
	for i := 1; i <= 20; i++ {
		name, host := fmt.Sprintf("web-%02d", i), []string{"hv-a", "hv-b"}[i%2]
		spec := "  profile: web\n  host: " + host + "\n"
		if writtenOut {
			spec = "  host: " + host + "\n" + webProfile(512)[strings.Index(webProfile(512), "  vcpus"):]
		}
		files["vms/"+name+".yaml"] = "apiVersion: gitfleet.dev/v1alpha1\nkind: VM\nmetadata: {name: " + name + "}\nspec:\n" + spec
	}
	return files
}

// TestPublishesEffectiveSpecs runs the controller over VMs on a profile:
// each host's snapshot is, byte for byte but its source commit, the one
// of the same VMs written out in full; a profile change is an edit of
// every VM (a new spec hash, a new epoch); deleting the profile they name
// is rejected (recorded in the ledger) and the host snapshots stay.
func TestPublishesEffectiveSpecs(t *testing.T) {
	gittest.NeedGit(t)
	onProfile, writtenOut := newEnv(t, profiledFleet(false)), newEnv(t, profiledFleet(true))
	if res := onProfile.pass(); res.Rejected != nil || len(res.Published) != 2 {
		t.Fatalf("first pass: rejected %v, published %v", res.Rejected, res.Published)
	}
	if res := writtenOut.pass(); res.Rejected != nil || len(res.Published) != 2 {
		t.Fatalf("written out: rejected %v, published %v", res.Rejected, res.Published)
	}
	before := map[string]*snapshots.Snapshot{}
	for _, host := range []string{"hv-a", "hv-b"} {
		got, want := onProfile.snapshot(host), writtenOut.snapshot(host)
		if len(got.VMs) != 10 {
			t.Fatalf("%s: %d VMs, want 10", host, len(got.VMs))
		}
		got.Source, want.Source = snapshots.SnapshotSource{}, snapshots.SnapshotSource{}
		g, err := snapshots.MarshalSnapshot(got)
		if err != nil {
			t.Fatal(err)
		}
		w, err := snapshots.MarshalSnapshot(want)
		if err != nil {
			t.Fatal(err)
		}
		if string(g) != string(w) {
			t.Errorf("%s: the snapshot of VMs on a profile\n%s\nis not the one of the VMs written out\n%s", host, g, w)
		}
		if strings.Contains(string(g), "profile") {
			t.Errorf("%s: the snapshot names the profile:\n%s", host, g)
		}
		before[host] = got
	}

	onProfile.commit(gittest.Edit{Write: map[string]string{"profiles/web.yaml": webProfile(1024)}, Message: "web: 1 GiB"})
	res := onProfile.pass()
	if res.Rejected != nil || len(res.Published) != 2 {
		t.Fatalf("profile change: rejected %v, published %v", res.Rejected, res.Published)
	}
	for _, host := range []string{"hv-a", "hv-b"} {
		s := onProfile.snapshot(host)
		if s.Epoch <= before[host].Epoch {
			t.Errorf("%s: epoch %d after %d", host, s.Epoch, before[host].Epoch)
		}
		for i, vm := range s.VMs {
			if vm.Spec.MemoryMB != 1024 || vm.SpecHash != desired.SpecHash(vm.Spec) || vm.SpecHash == before[host].VMs[i].SpecHash {
				t.Errorf("%s: %s memoryMB %d, hash %s (was %s)", host, vm.Name, vm.Spec.MemoryMB, vm.SpecHash, before[host].VMs[i].SpecHash)
			}
		}
	}

	published := map[string]string{}
	for _, host := range []string{"hv-a", "hv-b"} {
		published[host] = gittest.Show(t, onProfile.dir, "refs/heads/"+DefaultSnapshotsBranch, snapshots.Path(host))
	}
	onProfile.commit(gittest.Edit{Remove: []string{"profiles/web.yaml"}, Message: "drop the profile"})
	res = onProfile.pass()
	if res.Rejected == nil || !strings.Contains(res.Rejected.Error(), `Profile "web" does not exist`) || len(res.Tombstoned) != 0 {
		t.Fatalf("a used profile deleted: rejected %v, tombstoned %v", res.Rejected, res.Tombstoned)
	}
	for host, was := range published {
		if now := gittest.Show(t, onProfile.dir, "refs/heads/"+DefaultSnapshotsBranch, snapshots.Path(host)); now != was {
			t.Errorf("%s: the snapshot changed for a rejected commit:\n%s", host, now)
		}
	}
}
