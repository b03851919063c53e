package desired

import (
	"fmt"
	"sort"
	"strings"
)

// ProfilePlan is the change of one Profile and the VMs it reaches: the
// VMs that name the profile in head, grouped by what the change does to
// each (Reaches). A Profile is on no host, so its own change is listed
// apart from the hosts'; what it changes on each VM is in that VM's
// update on its host, field by field, as for any edit.
type ProfilePlan struct {
	Action Action `json:"action"`
	Name   string `json:"name"`
	// File is where the profile is defined (in base, for a delete).
	File string `json:"file"`
	// Fields are the profile's changed fields, rendered as a VM's are.
	Fields  []FieldChange  `json:"fields,omitempty"`
	Reaches []ProfileReach `json:"reaches,omitempty"`
}

// ProfileReach is the VMs on which a profile's change has one Effect:
// the effect of the VM's changed fields that the profile's change
// touches, EffectCreated for a VM created naming it (new, or moved to
// another host), EffectUnchanged for
// one whose effective spec it leaves as it was (the VM writes those
// fields itself). A VM with fields of several effects is in each group.
// VMs are sorted by name.
type ProfileReach struct {
	Effect Effect   `json:"effect"`
	VMs    []string `json:"vms"`
}

// The groups of ProfileReach beyond a field's Effect.
const (
	// EffectCreated: a VM created naming the profile (new, or on the
	// host it moves to).
	EffectCreated Effect = "created with these fields"
	// EffectUnchanged: a VM whose effective spec stays as it was.
	EffectUnchanged Effect = "unchanged: the VM writes these fields itself"
)

// reachOrder is the order in which a ProfilePlan lists its groups; an
// effect not listed here comes after, in name order.
var reachOrder = []Effect{EffectRestart, EffectNextBoot, EffectGrowsDisk, EffectBoots, EffectShutsDown,
	EffectNotApplied, EffectNone, EffectCreated, EffectUnchanged}

// profilePlans lists the profiles that differ between base and head, in
// name order, each with the VMs it reaches, from hosts (the plan's VM
// changes).
func profilePlans(base, head *Fleet, hosts []HostPlan) []ProfilePlan {
	vmChanges := map[string]PlanChange{}
	for _, h := range hosts {
		for _, c := range h.Changes {
			if c.Kind == KindVM && (c.Action == ActionUpdate || c.Action == ActionCreate) {
				vmChanges[c.Name] = c
			}
		}
	}
	old, cur := profileObjects(base), profileObjects(head)
	names := make([]string, 0, len(cur))
	for name := range cur {
		names = append(names, name)
	}
	for name := range old {
		if _, ok := cur[name]; !ok {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var plans []ProfilePlan
	for _, name := range names {
		o, inBase := old[name]
		n, inHead := cur[name]
		fields := diffFields(o.fields, n.fields)
		if len(fields) == 0 {
			continue
		}
		pp := ProfilePlan{Action: ActionUpdate, Name: name, Fields: fields}
		switch {
		case !inBase:
			pp.Action, pp.File = ActionCreate, head.Profiles[name].Origin.File
		case !inHead:
			pp.Action, pp.File = ActionDelete, base.Profiles[name].Origin.File
		default:
			pp.File = head.Profiles[name].Origin.File
		}
		if inHead && touchesSpec(fields) {
			pp.Reaches = reaches(head, name, fields, vmChanges)
		}
		plans = append(plans, pp)
	}
	return plans
}

// profileObjects flattens each profile of f as planObjects does objects.
func profileObjects(f *Fleet) map[string]planObject {
	return planObjects(f.Profiles, func(_ string, p *Profile) (string, Metadata, any) { return "", p.Metadata, p.Spec })
}

// reaches groups the VMs of head that name profile by what the profile's
// changed fields do to each, from the VMs' own changes.
func reaches(head *Fleet, profile string, fields []FieldChange, vmChanges map[string]PlanChange) []ProfileReach {
	groups := map[Effect][]string{}
	for name, vm := range head.VMs {
		if vm.Profile != profile {
			continue
		}
		c, changed := vmChanges[name]
		switch {
		case changed && c.Action == ActionCreate:
			groups[EffectCreated] = append(groups[EffectCreated], name)
			continue
		case !changed:
			groups[EffectUnchanged] = append(groups[EffectUnchanged], name)
			continue
		}
		effects := map[Effect]bool{}
		for _, f := range c.Fields {
			if touches(fields, f.Field) {
				effects[f.Effect] = true
			}
		}
		if len(effects) == 0 {
			effects[EffectUnchanged] = true
		}
		for e := range effects {
			groups[e] = append(groups[e], name)
		}
	}
	out := make([]ProfileReach, 0, len(groups))
	for e, vms := range groups {
		sort.Strings(vms)
		out = append(out, ProfileReach{Effect: e, VMs: vms})
	}
	sort.Slice(out, func(i, j int) bool {
		ri, rj := reachRank(out[i].Effect), reachRank(out[j].Effect)
		if ri != rj {
			return ri < rj
		}
		return out[i].Effect < out[j].Effect
	})
	return out
}

func reachRank(e Effect) int {
	for i, o := range reachOrder {
		if o == e {
			return i
		}
	}
	return len(reachOrder)
}

// touchesSpec reports whether any of a profile's changed fields is of its
// spec: its metadata is its own, and reaches no VM.
func touchesSpec(fields []FieldChange) bool {
	for _, f := range fields {
		if strings.HasPrefix(f.Field, "spec.") {
			return true
		}
	}
	return false
}

// touches reports whether a VM's changed field lies at, under or above
// one of the profile's changed fields.
func touches(fields []FieldChange, field string) bool {
	for _, f := range fields {
		if f.Field == field || strings.HasPrefix(field, f.Field+".") || strings.HasPrefix(f.Field, field+".") {
			return true
		}
	}
	return false
}

// reachedCount is the number of VMs a ProfilePlan reaches (a VM in
// several groups counts once).
func (pp ProfilePlan) reachedCount() int {
	seen := map[string]bool{}
	for _, r := range pp.Reaches {
		for _, vm := range r.VMs {
			seen[vm] = true
		}
	}
	return len(seen)
}

// profilesText renders the profile changes for Plan.Text.
func (p *Plan) profilesText(b *strings.Builder) {
	for _, pp := range p.Profiles {
		fmt.Fprintf(b, "\nprofile %s (%s)\n", pp.Name, pp.File)
		fmt.Fprintf(b, "  %s %s Profile %s\n", actionSign[pp.Action], pp.Action, pp.Name)
		for _, f := range pp.Fields {
			fmt.Fprintf(b, "      %s: %s -> %s\n", f.Field, orNone(f.Old), orNone(f.New))
		}
		if len(pp.Reaches) == 0 {
			if pp.Action != ActionDelete {
				b.WriteString("  reaches no VM\n")
			}
			continue
		}
		fmt.Fprintf(b, "  reaches %s:\n", countOf(pp.reachedCount(), "VM", "VMs"))
		for _, r := range pp.Reaches {
			fmt.Fprintf(b, "    %s (%d): %s\n", r.Effect, len(r.VMs), strings.Join(r.VMs, ", "))
		}
	}
}

// profilesMarkdown renders the profile changes for Plan.Markdown.
func (p *Plan) profilesMarkdown(b *strings.Builder) {
	for _, pp := range p.Profiles {
		fmt.Fprintf(b, "#### profile `%s`\n\n", pp.Name)
		fmt.Fprintf(b, "- **%s** Profile `%s` (`%s`)\n", pp.Action, pp.Name, mdCode(pp.File))
		for _, f := range pp.Fields {
			fmt.Fprintf(b, "  - `%s`: `%s` → `%s`\n", f.Field, mdCode(orNone(f.Old)), mdCode(orNone(f.New)))
		}
		switch {
		case len(pp.Reaches) > 0:
			fmt.Fprintf(b, "- reaches %s:\n", countOf(pp.reachedCount(), "VM", "VMs"))
			for _, r := range pp.Reaches {
				fmt.Fprintf(b, "  - **%s** (%d): `%s`\n", r.Effect, len(r.VMs), strings.Join(r.VMs, "`, `"))
			}
		case pp.Action != ActionDelete:
			b.WriteString("- reaches no VM\n")
		}
		b.WriteString("\n")
	}
}
