package qemu

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/debianguest"
)

// debianBootLimit bounds the wait for a Debian guest to answer on SSH and
// finish cloud-init: one to two minutes under TCG on an idle machine,
// several times that on two cores shared with other builds. It only ends a
// broken run; nothing asserts on time.
const debianBootLimit = 20 * time.Minute

// TestDebianGuestRunsUserDataAsWritten boots the real Debian 12 cloud guest
// (cloud-init 22.4, openssh-server) three times at once, each seeded with
// sshAuthorizedKeys and user-data in one format — a #cloud-config holding
// YAML 1.1 words (lock_passwd: no, ssh_pwauth: no, a date, 1:30), a
// #cloud-config-archive, a MIME multipart — and checks inside the guest
// that the seed's key logs in, each part ran, the password state and sshd's
// configuration are what the user wrote, and cloud-init finished without an
// error or a schema complaint.
func TestDebianGuestRunsUserDataAsWritten(t *testing.T) {
	if testing.Short() {
		t.Skip("boots the real Debian guest three times; skipped with -short")
	}
	needQEMU(t)
	if why := debianguest.Missing(); why != "" {
		t.Skipf("building the Debian guest needs %s", why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute+debianBootLimit)
	t.Cleanup(cancel) // after the parallel subtests, not when this function returns
	g, err := debianguest.Build(ctx, debianguest.TestCacheDir())
	if err != nil {
		t.Fatalf("build the Debian guest: %v", err)
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	authorized := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub))) + " gitfleet-test"

	examples := userDataExamples(t)
	vmRoot := t.TempDir()
	p, err := New(Config{
		CacheDir: t.TempDir(), Accel: AccelTCG,
		Artifacts:        ArtifactPolicy{FileRoots: []string{filepath.Dir(g.Image), filepath.Dir(g.Kernel), filepath.Dir(g.Initrd)}},
		MachineDir:       func(name string) string { return filepath.Join(vmRoot, name) },
		PowerdownTimeout: 10 * time.Second, KillTimeout: 5 * time.Second, BootTimeout: 2 * time.Minute,
		Logger: quietLog().Logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	base := desired.VMSpec{
		VCPUs: 1, MemoryMB: 512, DiskGB: 3,
		Image: &desired.Artifact{URL: "file://" + g.Image, SHA256: g.ImageSHA256},
		Kernel: &desired.Kernel{URL: "file://" + g.Kernel, SHA256: g.KernelSHA256, Cmdline: g.Cmdline,
			Initrd: &desired.Artifact{URL: "file://" + g.Initrd, SHA256: g.InitrdSHA256}},
	}
	// The image is fetched into the cache once, before the VMs race for it.
	if err := p.Stage(ctx, agent.Machine{Name: "stage", Dir: filepath.Join(vmRoot, "stage"), Spec: base}); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name string
		// checks are shell commands run as the default user, each with the
		// text its output must hold.
		checks [][2]string
	}{
		{"cloud-config", [][2]string{
			// lock_passwd: no — alice's password is usable ("P"), not locked ("L").
			{"sudo passwd -S alice | cut -d' ' -f2", "P\n"},
			// ssh_pwauth: no — sshd refuses passwords.
			{"sudo sshd -T | grep -i '^passwordauthentication '", "passwordauthentication no\n"},
			{"cat /etc/gitfleet-probe", "written 2024-01-31 at 1:30\n"},
			{"cat /var/tmp/gitfleet-cloud-config", "cloud-config-ran\n"},
		}},
		{"archive", [][2]string{
			{"cat /var/tmp/gitfleet-archive-config", "archive-config-ran\n"},
			{"cat /var/tmp/gitfleet-archive-script", "archive-script-ran\n"},
		}},
		{"mime", [][2]string{
			{"cat /var/tmp/gitfleet-mime-config", "mime-config-ran\n"},
			{"cat /var/tmp/gitfleet-mime-script", "mime-script-ran\n"},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			name := "deb-" + tc.name
			dir := filepath.Join(vmRoot, name)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			spec := base
			spec.CloudInit = &desired.CloudInit{SSHAuthorizedKeys: []string{authorized}, UserData: examples[tc.name]}
			m := agent.Machine{Name: name, Dir: dir, Spec: spec, InstanceID: name + "-0001"}
			t.Cleanup(func() { p.Destroy(context.Background(), name) })
			if err := p.PrepareRootDisk(ctx, m); err != nil {
				t.Fatal(err)
			}
			if err := p.Boot(ctx, m); err != nil {
				t.Fatal(err)
			}
			addr := p.Address(name).SSH
			client := dialGuest(ctx, t, addr, debianguest.User, ssh.PublicKeys(signer), dir)
			defer client.Close()

			// Every stage ran: the final one (scripts, runcmd) writes
			// boot-finished. status --wait alone returns at the first
			// error, before the final stage.
			guestRun(t, client, "timeout 600 sh -c 'until [ -e /var/lib/cloud/instance/boot-finished ]; do sleep 2; done'")
			out := guestRun(t, client, "cloud-init status --long")
			if strings.Contains(strings.ToLower(out), "schema") || strings.Contains(out, "Invalid cloud-config") {
				t.Errorf("cloud-init status --long complains about the user-data:\n%s", out)
			}
			// No module failed, but for one the test image cannot run.
			errs := guestRun(t, client, `python3 -c 'import json; [print(e) for s in json.load(open("/run/cloud-init/result.json"))["v1"]["errors"] for e in [s]]'`)
			for _, e := range strings.Split(strings.TrimSpace(errs), "\n") {
				// The image has no locales package, so cc_locale's
				// update-locale fails whatever the user-data says.
				if e != "" && !strings.Contains(e, "'locale'") {
					t.Errorf("cloud-init error: %s", e)
				}
			}
			// Nothing cloud-init logged is about the user-data's shape.
			if out := guestRun(t, client, "sudo grep -E 'WARNING|ERROR' /var/log/cloud-init.log | grep -iE 'invalid cloud-config|schema|yaml|unhandled|content-type|mime' || true"); strings.TrimSpace(out) != "" {
				t.Errorf("cloud-init logged about the user-data:\n%s", out)
			}
			for _, c := range tc.checks {
				if got := guestRun(t, client, c[0]); got != c[1] {
					t.Errorf("%s: got %q, want %q", c[0], got, c[1])
				}
			}
			if tc.name == "cloud-config" {
				// The password alice has does not log her in over SSH.
				_, err := ssh.Dial("tcp", addr, &ssh.ClientConfig{User: "alice", Auth: []ssh.AuthMethod{ssh.Password("gitfleet-test")},
					HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: time.Minute})
				if err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
					t.Errorf("password login of alice: %v; want it refused", err)
				}
			}
		})
	}
}

// dialGuest logs in to the guest over its SSH forward, retrying until the
// guest answers with the seed's key or debianBootLimit passes; it ends the
// test with the serial console's tail when the guest never does.
func dialGuest(ctx context.Context, t *testing.T, addr, user string, auth ssh.AuthMethod, dir string) *ssh.Client {
	t.Helper()
	cfg := &ssh.ClientConfig{User: user, Auth: []ssh.AuthMethod{auth},
		HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 30 * time.Second}
	deadline := time.Now().Add(debianBootLimit)
	var last error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		c, err := ssh.Dial("tcp", addr, cfg)
		if err == nil {
			return c
		}
		last = err
		time.Sleep(3 * time.Second)
	}
	s := serial(dir)
	if len(s) > 4000 {
		s = s[len(s)-4000:]
	}
	t.Fatalf("guest never let %s in over %s: %v\nserial console tail:\n%s", user, addr, last, s)
	return nil
}

// guestRun runs cmd in the guest and returns its combined output.
func guestRun(t *testing.T, c *ssh.Client, cmd string) string {
	t.Helper()
	s, err := c.NewSession()
	if err != nil {
		t.Fatalf("ssh session: %v", err)
	}
	defer s.Close()
	out, err := s.CombinedOutput(cmd)
	if err != nil {
		t.Logf("%s: %v", cmd, err)
	}
	return string(out)
}
