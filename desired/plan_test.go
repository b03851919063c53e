package desired

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/testsupport/golden"
)

// planGolden compares got with testdata/plan/<name>; -update rewrites it.
func planGolden(t *testing.T, name, got string) {
	t.Helper()
	golden.Check(t, "plan/"+name, []byte(got))
}

const testSHA = "64a7b8b7a4ad44f1d2c1e6b8a1c8f1e0c4b1a2d3e4f5a6b7c8d9e0f1a2b3c4d5"

func planVM(name, host string, mod ...func(*VMSpec)) *VM {
	vm := &VM{Metadata: Metadata{Name: name}, Spec: VMSpec{Host: host, VCPUs: 2, MemoryMB: 2048, DiskGB: 20,
		Image: &Artifact{URL: "https://example.com/debian.qcow2", SHA256: testSHA}, Power: PowerRunning}}
	for _, m := range mod {
		m(&vm.Spec)
	}
	return vm
}

func planFleet(objs ...any) *Fleet {
	f := &Fleet{VMs: map[string]*VM{}, Volumes: map[string]*Volume{}, Hosts: map[string]*Host{}}
	for _, o := range objs {
		switch o := o.(type) {
		case *VM:
			f.VMs[o.Metadata.Name] = o
		case *Volume:
			f.Volumes[o.Metadata.Name] = o
		case *Host:
			f.Hosts[o.Metadata.Name] = o
		}
	}
	return f
}

func planHost(name string) *Host {
	return &Host{Metadata: Metadata{Name: name}, Spec: HostSpec{Capacity: &Capacity{VCPUs: 32, MemoryMB: 131072}}}
}

func planVolume(name, host string, size int) *Volume {
	return &Volume{Metadata: Metadata{Name: name}, Spec: VolumeSpec{Host: host, SizeGB: size}}
}

// actions flattens a plan to "host: action kind name" lines.
func actions(p *Plan) []string {
	var out []string
	for _, h := range p.Hosts {
		for _, c := range h.Changes {
			out = append(out, h.Host+": "+string(c.Action)+" "+string(c.Kind)+" "+c.Name)
		}
	}
	return out
}

func TestComputePlanActions(t *testing.T) {
	hosts := []any{planHost("hv-a"), planHost("hv-b")}
	with := func(objs ...any) *Fleet { return planFleet(append(append([]any{}, hosts...), objs...)...) }
	for _, tc := range []struct {
		name       string
		base, head *Fleet
		pending    []ObjectRef
		want       []string
	}{
		{"no change", with(planVM("web-01", "hv-a")), with(planVM("web-01", "hv-a")), nil, nil},
		{"create", with(), with(planVM("web-01", "hv-a")), nil, []string{"hv-a: create VM web-01"}},
		{"delete", with(planVM("web-01", "hv-a")), with(), nil, []string{"hv-a: delete VM web-01"}},
		{"update", with(planVM("web-01", "hv-a")), with(planVM("web-01", "hv-a", func(s *VMSpec) { s.VCPUs = 4 })), nil,
			[]string{"hv-a: update VM web-01"}},
		{"host move", with(planVM("web-01", "hv-a")), with(planVM("web-01", "hv-b")), nil,
			[]string{"hv-a: delete VM web-01", "hv-b: create VM web-01"}},
		{"undelete", with(), with(planVM("web-01", "hv-a")), []ObjectRef{{Kind: KindVM, Name: "web-01", Host: "hv-a"}},
			[]string{"hv-a: undelete VM web-01"}},
		{"pending on another host is a create", with(), with(planVM("web-01", "hv-b")),
			[]ObjectRef{{Kind: KindVM, Name: "web-01", Host: "hv-a"}}, []string{"hv-b: create VM web-01"}},
		{"volume delete", with(planVolume("data", "hv-a", 50)), with(), nil, []string{"hv-a: delete Volume data"}},
		{"new host from empty", nil, planFleet(planHost("hv-c")), nil, []string{"hv-c: create Host hv-c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := actions(ComputePlan(tc.base, tc.head, PlanOptions{Pending: tc.pending}))
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("plan = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestPlanNeverShowsSecrets(t *testing.T) {
	base := planFleet(planHost("hv-a"), planVM("web-01", "hv-a", func(s *VMSpec) {
		s.CloudInit = &CloudInit{UserData: "#cloud-config\npassword: hunter2", SSHAuthorizedKeys: []string{"ssh-ed25519 AAAAold"}}
	}))
	head := planFleet(planHost("hv-a"), planVM("web-01", "hv-a", func(s *VMSpec) {
		s.CloudInit = &CloudInit{UserData: "#cloud-config\npassword: hunter3", SSHAuthorizedKeys: []string{"ssh-ed25519 AAAAnew"}}
	}))
	p := ComputePlan(base, head, PlanOptions{})
	js, err := p.JSON()
	if err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{p.Text(), p.Markdown(), string(js)} {
		for _, secret := range []string{"hunter", "AAAA"} {
			if strings.Contains(out, secret) {
				t.Errorf("plan output shows a secret %q:\n%s", secret, out)
			}
		}
	}
	if got := actions(p); !reflect.DeepEqual(got, []string{"hv-a: update VM web-01"}) {
		t.Errorf("a secret-only change must still be an update, got %q", got)
	}
}

// TestPlanGolden renders one plan with every kind of change in all three
// formats.
func TestPlanGolden(t *testing.T) {
	base := planFleet(planHost("hv-a"), planHost("hv-b"), planHost("hv-old"),
		planVM("web-01", "hv-a"),
		planVM("web-02", "hv-a"),
		planVM("db-01", "hv-a", func(s *VMSpec) { s.Volumes = []string{"db-data"} }),
		planVM("mover", "hv-a"),
		planVolume("db-data", "hv-a", 50),
		planVolume("scratch", "hv-b", 10),
	)
	head := planFleet(planHost("hv-a"), planHost("hv-b"), planHost("hv-new"),
		planVM("web-01", "hv-a", func(s *VMSpec) {
			s.VCPUs, s.MemoryMB, s.DiskGB, s.Power = 4, 4096, 10, PowerStopped
			s.Image = &Artifact{URL: "https://example.com/debian-13.qcow2", SHA256: testSHA}
		}),
		planVM("db-01", "hv-a"),
		planVM("mover", "hv-b"),
		planVM("back-01", "hv-b"),
		planVM("new-01", "hv-new", func(s *VMSpec) { s.Volumes = []string{"new-data"} }),
		planVolume("db-data", "hv-a", 80),
		planVolume("new-data", "hv-new", 5),
	)
	p := ComputePlan(base, head, PlanOptions{Pending: []ObjectRef{{Kind: KindVM, Name: "back-01", Host: "hv-b"}}})
	p.Base, p.Head = "0123456789abcdef0123456789abcdef01234567", "main"
	planGolden(t, "full.txt", p.Text())
	planGolden(t, "full.md", p.Markdown())
	js, err := p.JSON()
	if err != nil {
		t.Fatal(err)
	}
	planGolden(t, "full.json", string(js))
	var back Plan
	if err := json.Unmarshal(js, &back); err != nil || !reflect.DeepEqual(&back, p) {
		t.Errorf("JSON does not round-trip: %v", err)
	}

	withErr := &Plan{Base: "main", Head: "feature", Hosts: []HostPlan{},
		Errors: []string{"vms/web.yaml:4:3: spec.vcpus: must be at least 1"}}
	planGolden(t, "errors.txt", withErr.Text())
	planGolden(t, "errors.md", withErr.Markdown())
	warned := ComputePlan(nil, planFleet(planHost("hv-a"), planVM("web-01", "hv-a")), PlanOptions{})
	warned.Base, warned.Head = "main", "fix"
	warned.Warnings = []string{"base main does not validate (1 error); planned against an empty base: every object of head shows as a create"}
	planGolden(t, "warned.txt", warned.Text())
	planGolden(t, "warned.md", warned.Markdown())
	if txt := warned.Text(); !strings.HasPrefix(txt, "Plan main -> fix\n\n! base main does not validate") {
		t.Errorf("the warning is not at the top:\n%s", txt)
	}
	empty := ComputePlan(base, base, PlanOptions{})
	empty.Base, empty.Head = "a", "b"
	if !empty.Empty() {
		t.Errorf("plan of a fleet against itself is not empty: %q", actions(empty))
	}
	planGolden(t, "empty.txt", empty.Text())
}

// TestPlanSaysWhatHappensToTheGuest pins the Effect of each kind of VM
// field change, and the warning a cloudInit edit carries: the key rotation
// of a running VM is shown as not applied, with how to rotate instead.
func TestPlanSaysWhatHappensToTheGuest(t *testing.T) {
	withKeys := func(keys ...string) func(*VMSpec) {
		return func(s *VMSpec) { s.CloudInit = &CloudInit{SSHAuthorizedKeys: keys} }
	}
	for _, tc := range []struct {
		name       string
		base, head []func(*VMSpec)
		field      string
		want       Effect
		warning    string
	}{
		{"vcpus of a running VM", nil, []func(*VMSpec){func(s *VMSpec) { s.VCPUs = 4 }}, "spec.vcpus", EffectRestart, ""},
		{"kernel sha256 of a running VM", []func(*VMSpec){func(s *VMSpec) { s.Kernel = &Kernel{URL: "https://k", SHA256: testSHA} }},
			[]func(*VMSpec){func(s *VMSpec) { s.Kernel = &Kernel{URL: "https://k", SHA256: strings.Repeat("b", 64)} }}, "spec.kernel.sha256", EffectRestart, ""},
		{"memory of a VM stopped by the same change", nil, []func(*VMSpec){func(s *VMSpec) { s.MemoryMB = 4096; s.Power = PowerStopped }}, "spec.memoryMB", EffectNextBoot, ""},
		{"a larger disk", nil, []func(*VMSpec){func(s *VMSpec) { s.DiskGB = 40 }}, "spec.diskGB", EffectGrowsDisk, ""},
		{"a smaller disk", nil, []func(*VMSpec){func(s *VMSpec) { s.DiskGB = 10 }}, "spec.diskGB", EffectNotApplied, "never shrink"},
		{"power off", nil, []func(*VMSpec){func(s *VMSpec) { s.Power = PowerStopped }}, "spec.power", EffectShutsDown, ""},
		{"power on", []func(*VMSpec){func(s *VMSpec) { s.Power = PowerStopped }}, []func(*VMSpec){func(s *VMSpec) { s.Power = PowerRunning }}, "spec.power", EffectBoots, ""},
		{"vcpus of a VM booted by the same change", []func(*VMSpec){func(s *VMSpec) { s.Power = PowerStopped }},
			[]func(*VMSpec){func(s *VMSpec) { s.Power = PowerRunning; s.VCPUs = 4 }}, "spec.vcpus", EffectNextBoot, ""},
		{"image", nil, []func(*VMSpec){func(s *VMSpec) { s.Image.SHA256 = strings.Repeat("c", 64) }}, "spec.image.sha256", EffectNotApplied, "existing root disk"},
		{"mac of a running VM", nil, []func(*VMSpec){func(s *VMSpec) { s.MAC = "52:54:00:6b:3c:9a" }}, "spec.mac", EffectRestart, ""},
		{"an adopted root disk", nil, []func(*VMSpec){func(s *VMSpec) { s.RootDisk = &RootDisk{Adopt: true} }}, "spec.rootDisk.adopt", EffectNotApplied, "keeps the root disk it has"},
		{"key rotation", []func(*VMSpec){withKeys("ssh-ed25519 AAAAold")}, []func(*VMSpec){withKeys("ssh-ed25519 AAAAnew")},
			"spec.cloudInit.sshAuthorizedKeys", EffectNotApplied, "to rotate an SSH key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := planFleet(planHost("hv-a"), planVM("web-01", "hv-a", tc.base...))
			head := planFleet(planHost("hv-a"), planVM("web-01", "hv-a", tc.head...))
			p := ComputePlan(base, head, PlanOptions{})
			if len(p.Hosts) != 1 || len(p.Hosts[0].Changes) != 1 {
				t.Fatalf("plan: %+v", p)
			}
			c := p.Hosts[0].Changes[0]
			var got *FieldChange
			for i := range c.Fields {
				if c.Fields[i].Field == tc.field {
					got = &c.Fields[i]
				}
			}
			if got == nil {
				t.Fatalf("no change of %s in %+v", tc.field, c.Fields)
			}
			if got.Effect != tc.want {
				t.Errorf("%s: effect %q, want %q", tc.field, got.Effect, tc.want)
			}
			if !strings.Contains(p.Text(), tc.field+": ") || !strings.Contains(p.Text(), "["+string(tc.want)+"]") {
				t.Errorf("text plan does not mark the change:\n%s", p.Text())
			}
			if !strings.Contains(p.Markdown(), "**"+string(tc.want)+"**") {
				t.Errorf("markdown plan does not mark the change:\n%s", p.Markdown())
			}
			if tc.warning != "" && !strings.Contains(strings.Join(c.Warnings, "\n"), tc.warning) {
				t.Errorf("warnings %q lack %q", c.Warnings, tc.warning)
			}
		})
	}
}

func TestPlanWarnsOfNetworkChanges(t *testing.T) {
	host := func(nets map[string]Network) *Host {
		h := planHost("hv-a")
		h.Spec.Networks = nets
		return h
	}
	lab := func(cidr string) map[string]Network {
		return map[string]Network{"lan": {Bridge: "br0"}, "lab": {NAT: &NAT{CIDR: cidr}}}
	}
	onLab := func(s *VMSpec) { s.Network = "lab" }
	nics := func(n ...NIC) func(*VMSpec) { return func(s *VMSpec) { s.NICs = n } }
	suspended := func(h *Host) *Host { h.Spec.Suspend, h.Spec.SuspendReason = true, "kernel upgrade"; return h }
	static := func(a string) func(*VMSpec) {
		return func(s *VMSpec) { s.Network, s.Static = "lab", &StaticIP{Addresses: []string{a}} }
	}
	for _, tc := range []struct {
		name       string
		base, head *Fleet
		want       string
	}{
		{"a VM joins a network", planFleet(host(lab("10.77.0.0/24")), planVM("web-01", "hv-a")),
			planFleet(host(lab("10.77.0.0/24")), planVM("web-01", "hv-a", onLab)),
			"the VM restarts with its NIC on the new network, at a new address"},
		{"a VM's static address changes", planFleet(host(lab("10.77.0.0/24")), planVM("web-01", "hv-a", static("10.77.0.5/24"))),
			planFleet(host(lab("10.77.0.0/24")), planVM("web-01", "hv-a", static("10.77.0.6/24"))),
			"static addresses reach the guest in cloud-init's network-config, which cloud-init applies at an instance's first boot only: the created VM keeps the addresses it was created with; they apply when the VM is created again"},
		{"a VM's NIC static address changes",
			planFleet(host(lab("10.77.0.0/24")), planVM("web-01", "hv-a", nics(NIC{Network: "lab", Static: &StaticIP{Addresses: []string{"10.77.0.5/24"}}}))),
			planFleet(host(lab("10.77.0.0/24")), planVM("web-01", "hv-a", nics(NIC{Network: "lab", Static: &StaticIP{Addresses: []string{"10.77.0.6/24"}}}))),
			"static addresses reach the guest in cloud-init's network-config, which cloud-init applies at an instance's first boot only: the created VM keeps the addresses it was created with; they apply when the VM is created again"},
		{"a VM gains a NIC", planFleet(host(lab("10.77.0.0/24")), planVM("web-01", "hv-a", nics(NIC{Network: "lab"}))),
			planFleet(host(lab("10.77.0.0/24")), planVM("web-01", "hv-a", nics(NIC{Network: "lab"}, NIC{Network: "lan", Model: "e1000e"}))),
			NICsEditWarning},
		{"a nat network is renumbered", planFleet(host(lab("10.77.0.0/24"))), planFleet(host(lab("10.78.0.0/24"))),
			"network lab is renumbered: its guests get new addresses at their next DHCP renewal (within 30 minutes) or restart"},
		{"a network is removed", planFleet(host(lab("10.77.0.0/24"))), planFleet(host(map[string]Network{"lan": {Bridge: "br0"}})),
			"network lab is removed from the host once no VM there uses it"},
		{"a bridge network moves to another bridge", planFleet(host(lab("10.77.0.0/24"))),
			planFleet(host(map[string]Network{"lan": {Bridge: "br1"}, "lab": {NAT: &NAT{CIDR: "10.77.0.0/24"}}})),
			"network lan moves from bridge br0 to bridge br1: its running guests stay on br0 until they restart"},
		{"a nat network becomes a bridge network", planFleet(host(lab("10.77.0.0/24"))),
			planFleet(host(map[string]Network{"lan": {Bridge: "br0"}, "lab": {Bridge: "br1"}})),
			"network lab changes from nat to bridge: its running guests stay on the nat network until they restart"},
		{"a bridge network becomes a nat network", planFleet(host(lab("10.77.0.0/24"))),
			planFleet(host(map[string]Network{"lan": {NAT: &NAT{CIDR: "10.78.0.0/24"}}, "lab": {NAT: &NAT{CIDR: "10.77.0.0/24"}}})),
			"network lan changes from bridge to nat: its running guests stay on the bridge until they restart"},
		{"a host is suspended", planFleet(host(nil)), planFleet(suspended(host(nil))), SuspendWarning},
		{"a VM of a suspended host changes", planFleet(suspended(host(nil)), planVM("web-01", "hv-a")),
			planFleet(suspended(host(nil)), planVM("web-01", "hv-a", func(s *VMSpec) { s.VCPUs = 4 })), SuspendedWaitWarning},
		{"a host resumes", planFleet(suspended(host(nil))), planFleet(host(nil)),
			"reconciliation resumes: the host's agent applies every change that waited while it was suspended"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := ComputePlan(tc.base, tc.head, PlanOptions{})
			var warnings []string
			for _, h := range p.Hosts {
				for _, c := range h.Changes {
					warnings = append(warnings, c.Warnings...)
				}
			}
			if !reflect.DeepEqual(warnings, []string{tc.want}) {
				t.Errorf("warnings = %q, want %q", warnings, tc.want)
			}
		})
	}
}

// A label is metadata: the plan says the guest sees nothing of it. A VM
// kept after a history rewrite whose file comes back is desired again, not
// created; the same name without a retained record is a create.
func TestPlanLabelsAndRestoredObjects(t *testing.T) {
	labelled := planVM("web-01", "hv-a")
	labelled.Metadata.Labels = map[string]string{"tier": "front"}
	p := ComputePlan(planFleet(planHost("hv-a"), planVM("web-01", "hv-a")), planFleet(planHost("hv-a"), labelled), PlanOptions{})
	if len(p.Hosts) != 1 || len(p.Hosts[0].Changes) != 1 || len(p.Hosts[0].Changes[0].Fields) != 1 ||
		p.Hosts[0].Changes[0].Fields[0].Effect != EffectNone {
		t.Errorf("a label change: %+v", p)
	}

	base, head := planFleet(planHost("hv-a")), planFleet(planHost("hv-a"), planVM("ci-01", "hv-a"))
	kept := []ObjectRef{{Kind: KindVM, Name: "ci-01", Host: "hv-a"}}
	p = ComputePlan(base, head, PlanOptions{Retained: kept})
	if got := actions(p); !reflect.DeepEqual(got, []string{"hv-a: undelete VM ci-01"}) {
		t.Errorf("a retained VM restored: %q", got)
	}
	if w := p.Hosts[0].Changes[0].Warnings; !reflect.DeepEqual(w, []string{RetainedRestoreWarning}) {
		t.Errorf("warnings %q", w)
	}
	elsewhere := []ObjectRef{{Kind: KindVM, Name: "ci-01", Host: "hv-b"}}
	if got := actions(ComputePlan(base, head, PlanOptions{Retained: elsewhere})); !reflect.DeepEqual(got, []string{"hv-a: create VM ci-01"}) {
		t.Errorf("a VM retained on another host: %q", got)
	}
}

// TestPlanShowsTheRecipientNotTheCiphertext: the age recipient of
// encrypted user-data is a public key, and a plan that hid its change would
// hide a re-encryption to another host; the ciphertext stays masked.
func TestPlanShowsTheRecipientNotTheCiphertext(t *testing.T) {
	sealed := func(recipient, ciphertext string) func(*VMSpec) {
		return func(s *VMSpec) {
			s.CloudInit = &CloudInit{EncryptedUserData: &EncryptedUserData{Recipient: recipient, Ciphertext: ciphertext}}
		}
	}
	base := planFleet(planHost("hv-a"), planVM("web-01", "hv-a", sealed("age1oldrecipient", "CIPHERold")))
	head := planFleet(planHost("hv-a"), planVM("web-01", "hv-a", sealed("age1newrecipient", "CIPHERnew")))
	p := ComputePlan(base, head, PlanOptions{})
	out := p.Text()
	for _, want := range []string{"age1oldrecipient", "age1newrecipient"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan does not show the recipient %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "CIPHER") {
		t.Errorf("plan shows the ciphertext:\n%s", out)
	}
}
