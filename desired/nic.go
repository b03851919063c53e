package desired

import (
	"crypto/sha256"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"

	"github.com/gitfleet/gitfleet/internal/safetext"
)

// MaxNICs is the most NICs one VM may have.
const MaxNICs = 8

// NIC models QEMU emulates that a VM may name. DefaultNICModel, virtio's
// paravirtual NIC, is the fastest and what every cloud image drives; the
// others are for guests without virtio drivers.
const (
	DefaultNICModel = "virtio-net-pci"
)

// NICModels are the values NIC.Model may take: QEMU -device names.
var NICModels = []string{DefaultNICModel, "e1000e", "e1000", "rtl8139"}

// NIC is one network interface of a VM, on a network of its Host.
type NIC struct {
	// Network names a network of the VM's Host (HostSpec.Networks).
	Network string `yaml:"network" json:"network"`
	// MAC is the NIC's fixed MAC address, six colon-separated pairs of
	// hex digits ("52:54:00:12:34:56"), unicast; when empty the agent
	// derives one from the VM's name and the NIC's index (NICMAC). Two
	// NICs of the fleet never share one.
	MAC string `yaml:"mac,omitempty" json:"mac,omitempty"`
	// Model is the emulated device, one of NICModels; empty means
	// DefaultNICModel.
	Model string `yaml:"model,omitempty" json:"model,omitempty"`
	// Static gives the NIC fixed addresses instead of DHCP, as
	// VMSpec.Static does for the one-NIC form.
	Static *StaticIP `yaml:"static,omitempty" json:"static,omitempty"`
}

func (NIC) schema() typeSchema {
	return typeSchema{desc: "One NIC of the VM.", fields: map[string]fieldSchema{
		"network": {shape: "name", desc: "A network of the VM's Host."},
		"mac": {pattern: macPattern,
			desc: "Fixed unicast MAC address such as 52:54:00:12:34:56; derived from the VM's name and the NIC's index when absent. Unique in the fleet."},
		"model":  {enum: NICModels, def: DefaultNICModel, desc: "The emulated NIC (a QEMU device)."},
		"static": {desc: "Fixed addresses for this NIC instead of DHCP (netplan's field names)."},
	}}
}

// macPattern is the shape of NIC.MAC.
const macPattern = `^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$`

var macRE = regexp.MustCompile(macPattern)

// Interfaces is the VM's NICs: NICs as written, or for the one-NIC form
// (Network, Static) one NIC on Network; nil for a VM on the hypervisor's
// user-mode network.
func (s VMSpec) Interfaces() []NIC {
	switch {
	case len(s.NICs) > 0:
		return s.NICs
	case s.Network != "":
		return []NIC{{Network: s.Network, Static: s.Static, MAC: s.MAC}}
	}
	return nil
}

// ModelOf is n's QEMU device: Model, or DefaultNICModel when empty.
func (n NIC) ModelOf() string {
	if n.Model == "" {
		return DefaultNICModel
	}
	return n.Model
}

// NICMAC is the MAC address of NIC index i (0-based) of VM vm: its fixed
// MAC in lowercase when it has one, else one derived from the VM's name
// and i (the sha256 of "gitfleet-mac:<vm>", with "#<i>" after the name
// for i > 0), locally administered and unicast, so it never collides
// with a vendor's range and stays the same across reboots, agent
// restarts and hosts. The fixed MAC must parse (CheckMAC).
func NICMAC(vm string, i int, n NIC) string {
	if n.MAC != "" {
		if hw, err := net.ParseMAC(n.MAC); err == nil {
			return hw.String()
		}
		return n.MAC
	}
	seed := "gitfleet-mac:" + vm
	if i > 0 {
		seed += "#" + strconv.Itoa(i)
	}
	h := sha256.Sum256([]byte(seed))
	h[0] = (h[0] | 0x02) &^ 0x01
	return net.HardwareAddr(h[:6]).String()
}

// CheckMAC reports why s is not a MAC address a NIC may have: six
// colon-separated pairs of hex digits, unicast (the first octet's lowest
// bit clear) and not all zeros. "" when it may. Both universally and
// locally administered addresses are taken, as QEMU's own 52:54:00 prefix
// and a vendor's cloned MAC both are in use.
func CheckMAC(s string) string {
	hw, err := net.ParseMAC(s)
	switch {
	case err != nil || len(hw) != 6 || !macRE.MatchString(s):
		return fmt.Sprintf("%q is not a MAC address such as 52:54:00:12:34:56", safetext.Truncate(s, 40))
	case hw[0]&1 != 0:
		return fmt.Sprintf("%s is a multicast address; a NIC's MAC is unicast (the first octet even)", s)
	case hw.String() == "00:00:00:00:00:00":
		return fmt.Sprintf("%s is not a usable MAC address", s)
	}
	return ""
}

// NICProblem is one reason a VM's NICs cannot be used, at Field
// ("nics[1].mac", relative to the spec).
type NICProblem struct {
	Field, Msg string
}

// CheckNICs checks what of a VM spec's NICs needs no other object: not
// both network and nics, at most MaxNICs, each NIC's network named, a
// well-formed MAC (CheckMAC) and model, no two NICs on one network and no
// MAC twice. Validation reports the problems at the fields' positions;
// the agent refuses a snapshot that has any.
func CheckNICs(s *VMSpec) []NICProblem {
	var out []NICProblem
	if len(s.NICs) > 0 && s.Network != "" {
		out = append(out, NICProblem{"nics", "has both network and nics; network is the one-NIC form of nics: list its network as a NIC"})
	}
	if len(s.NICs) > 0 && s.Static != nil {
		out = append(out, NICProblem{"static", "is for the one-NIC form (network); with nics, give each NIC its own static"})
	}
	if len(s.NICs) > MaxNICs {
		out = append(out, NICProblem{"nics", fmt.Sprintf("lists %d NICs; a VM has at most %d", len(s.NICs), MaxNICs)})
	}
	nets := map[string]int{}
	macs := map[string]int{}
	for i, n := range s.NICs {
		f := indexPath("nics", i)
		if j, ok := nets[n.Network]; ok && n.Network != "" {
			out = append(out, NICProblem{f + ".network", fmt.Sprintf("network %q is also nics[%d]'s; a VM has one NIC per network", n.Network, j)})
		} else {
			nets[n.Network] = i
		}
		if n.MAC != "" {
			if msg := CheckMAC(n.MAC); msg != "" {
				out = append(out, NICProblem{f + ".mac", msg})
				continue
			}
		}
		if n.Model != "" && !validModel(n.Model) {
			out = append(out, NICProblem{f + ".model", fmt.Sprintf("%q is not a NIC model this release emulates (%s)", n.Model, strings.Join(NICModels, ", "))})
		}
		mac := NICMAC("", i, n)
		if n.MAC == "" {
			continue // derived MACs differ by index
		}
		if j, ok := macs[mac]; ok {
			out = append(out, NICProblem{f + ".mac", fmt.Sprintf("%s is also nics[%d]'s MAC", mac, j)})
		} else {
			macs[mac] = i
		}
	}
	return out
}

func validModel(m string) bool {
	for _, v := range NICModels {
		if v == m {
			return true
		}
	}
	return false
}
