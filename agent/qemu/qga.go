package qemu

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"
)

// QGAChannel is the virtio-serial port name qemu-guest-agent opens in the
// guest (/dev/virtio-ports/org.qemu.guest_agent.0); Debian's
// qemu-guest-agent unit starts when it appears.
const QGAChannel = "org.qemu.guest_agent.0"

// qgaCall runs one qemu-guest-agent command over the socket at sock (the
// host end of the VM's QGAChannel) and decodes its "return" into out (nil
// to discard it). The call is a channelCall: bounded by ctx and by
// channelTimeout, and by MaxReplyBytes read in all, so a guest without an
// agent costs at most the time, and a guest that floods the channel at
// most the bytes (ErrReplyTooLong).
//
// The protocol is QMP's JSON without a greeting. The channel may still hold
// a reply to an exchange an earlier, timed-out call abandoned, so each call
// first sends 0xFF (which resets the agent's parser) and
// guest-sync-delimited with a random id; the agent answers with 0xFF and
// that id, and everything before is dropped. (QEMU's qemu-ga reference,
// "guest-sync-delimited".)
func qgaCall(ctx context.Context, sock, command string, args, out any) error {
	c, err := dialChannel(ctx, sock)
	if err != nil {
		return fmt.Errorf("guest agent %s: %w", command, err)
	}
	defer c.close()
	if err := qgaSync(c); err != nil {
		return fmt.Errorf("guest agent %s: sync: %w", command, err)
	}
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	if _, err := c.conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("guest agent %s: %w", command, err)
	}
	ret, err := qgaReply(c.r)
	if err != nil {
		return fmt.Errorf("guest agent %s: %w", command, err)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(ret, out); err != nil {
		return fmt.Errorf("guest agent %s: decode reply: %w", command, err)
	}
	return nil
}

// qgaSync sends 0xFF and guest-sync-delimited with a random id, and reads
// until the agent's 0xFF and that id.
func qgaSync(c *channelCall) error {
	id := rand.Int64N(1 << 53) // exact in a JSON number
	sync, _ := json.Marshal(map[string]any{"execute": "guest-sync-delimited", "arguments": map[string]any{"id": id}})
	if _, err := c.conn.Write(append(append([]byte{0xff}, sync...), '\n')); err != nil {
		return err
	}
	for {
		if _, err := c.r.ReadBytes(0xff); err != nil {
			return err
		}
		var resp struct {
			Return *int64 `json:"return"`
		}
		line, err := c.r.ReadBytes('\n')
		if err != nil {
			return err
		}
		if json.Unmarshal(line, &resp) == nil && resp.Return != nil && *resp.Return == id {
			return nil
		}
	}
}

// qgaReply reads lines until a reply: its "return", or its error.
func qgaReply(r *bufio.Reader) (json.RawMessage, error) {
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return nil, err
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
		}
		if json.Unmarshal(line, &resp) != nil {
			continue // not a reply (a stray 0xFF, a partial line)
		}
		if resp.Error != nil {
			return nil, fmt.Errorf("%s: %s", resp.Error.Class, resp.Error.Desc)
		}
		if resp.Return != nil {
			return resp.Return, nil
		}
	}
}

// GuestInterface is one network interface as qemu-guest-agent's
// guest-network-get-interfaces reports it: Name as the guest calls it
// ("eth0", "lo"), MAC in lowercase colon form ("" for lo on some guests),
// and its addresses.
type GuestInterface struct {
	Name      string           `json:"name"`
	MAC       string           `json:"hardware-address"`
	Addresses []GuestIPAddress `json:"ip-addresses"`
}

// GuestIPAddress is one address of a GuestInterface: Type is "ipv4" or
// "ipv6", Address the textual address, Prefix its prefix length in bits.
type GuestIPAddress struct {
	Type    string `json:"ip-address-type"`
	Address string `json:"ip-address"`
	Prefix  int    `json:"prefix"`
}

// GuestInterfaces asks the named VM's qemu-guest-agent for its network
// interfaces (guest-network-get-interfaces), within ctx and channelTimeout
// (10 s), reading at most MaxReplyBytes. It fails when the VM is unknown or not running, or when
// the guest runs no agent or it does not answer in time. Calls for one VM
// are serialized with the readiness probe, since the channel carries one
// conversation at a time.
func (p *Provisioner) GuestInterfaces(ctx context.Context, name string) ([]GuestInterface, error) {
	st := p.state(name, "")
	if st == nil || st.pid() == 0 {
		return nil, fmt.Errorf("guest interfaces of %s: vm not running", name)
	}
	st.qgaMu.Lock()
	defer st.qgaMu.Unlock()
	var ifs []GuestInterface
	if err := qgaCall(ctx, st.path(QGASocket), "guest-network-get-interfaces", nil, &ifs); err != nil {
		return nil, fmt.Errorf("guest interfaces of %s: %w", name, err)
	}
	return ifs, nil
}

// guestAddrRefresh is how old a guest agent's reported address may grow
// before guestAgentAddress asks again; guestAddrTimeout bounds one ask.
const (
	guestAddrRefresh = 30 * time.Second
	guestAddrTimeout = 3 * time.Second
)

// guestAddr caches the IPv4 address a VM's guest agent last reported for
// the VM's NIC, for the boot (QEMU pid) that reported it.
type guestAddr struct {
	mu         sync.Mutex
	pid        int
	addr       netip.Addr
	at         time.Time
	refreshing bool
}

// guestAgentAddress returns the IPv4 address the VM's guest agent last
// reported for the interface with MAC mac in the current boot (invalid
// when none is known yet). It never waits on the guest: when the cached
// answer is older than guestAddrRefresh it asks again in the background,
// bounded by guestAddrTimeout, so a guest without an agent costs one
// failed call per guestAddrRefresh. Loopback and link-local addresses are
// not where people reach a guest and are skipped.
func (p *Provisioner) guestAgentAddress(st *vmState, mac net.HardwareAddr) netip.Addr {
	pid := st.pid()
	g := &st.guestAddr
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.pid != pid {
		g.pid, g.addr, g.at = pid, netip.Addr{}, time.Time{}
	}
	if !g.refreshing && time.Since(g.at) >= guestAddrRefresh {
		g.refreshing = true
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), guestAddrTimeout)
			defer cancel()
			ifs, err := p.GuestInterfaces(ctx, st.name)
			a := addressForMAC(ifs, mac)
			g.mu.Lock()
			defer g.mu.Unlock()
			g.refreshing = false
			if g.pid != pid {
				return
			}
			g.at = time.Now()
			if err == nil {
				g.addr = a
			}
		}()
	}
	return g.addr
}

// addressForMAC is the first global IPv4 address of the interface in ifs
// whose hardware address is mac.
func addressForMAC(ifs []GuestInterface, mac net.HardwareAddr) netip.Addr {
	for _, i := range ifs {
		hw, err := net.ParseMAC(i.MAC)
		if err != nil || !bytes.Equal(hw, mac) {
			continue
		}
		for _, a := range i.Addresses {
			ip, err := netip.ParseAddr(a.Address)
			if err == nil && a.Type == "ipv4" && ip.Is4() && !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
				return ip
			}
		}
	}
	return netip.Addr{}
}
