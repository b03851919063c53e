package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/trust"
)

// Where keygen writes each key unless told otherwise, and the paths its
// setup text names.
const (
	defaultControllerKey = "/etc/gitfleet/controller_ed25519"
	defaultAgentKey      = "/etc/gitfleet/agent_ed25519"
)

func newKeygenCmd() *cobra.Command {
	var out, host string
	var controller bool
	cmd := &cobra.Command{
		Use:   "keygen (--controller | --host HOST) [--out FILE]",
		Short: "Make the controller's or a host agent's signing key and print where each part goes",
		Long: `Keygen makes a new ed25519 SSH key for signing commits and writes the
private key to --out (mode 0600, never overwritten) and the public key to
--out.pub. It prints the public key and the exact setup:

  --controller     the controller's key (default ` + defaultControllerKey + `): the
                   controller signs its snapshots with it (--signing-key); every
                   agent lists its public key in controllerKeys and accepts only
                   snapshots signed by it.
  --host HOST      HOST's agent key (default ` + defaultAgentKey + `): the agent signs
                   its status commits with it (signingKey); the Host object's
                   spec.agentKey names its public key, and the controller
                   finalizes deletes only on acks signed by it.

The files are OpenSSH's own format: "ssh-keygen -t ed25519 -N '' -C COMMENT
-f FILE" makes an equivalent key, and "ssh-keygen -y -f FILE" prints the
public key line again. Keep the private key on its machine only.`,
		Args: noArgs("keygen"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if controller == (host != "") {
				return &exitError{code: 2, err: errors.New("keygen: give --controller or --host HOST (one of them)")}
			}
			if host != "" {
				if err := agent.CheckHostName(host); err != nil {
					return &exitError{code: 2, err: fmt.Errorf("keygen: --host: %w", err)}
				}
			}
			if out == "" {
				out = defaultControllerKey
				if host != "" {
					out = defaultAgentKey
				}
			}
			return runKeygen(cmd.OutOrStdout(), out, host)
		},
	}
	cmd.Flags().BoolVar(&controller, "controller", false, "make the controller's snapshot signing key")
	cmd.Flags().StringVar(&host, "host", "", "make the signing key of this host's agent")
	cmd.Flags().StringVar(&out, "out", "", "private key file to write (mode 0600; never overwritten; the public key goes to FILE.pub); default "+defaultControllerKey+" or "+defaultAgentKey)
	return cmd
}

// runKeygen writes the key pair to out and out.pub and prints the setup;
// host is "" for the controller's key.
func runKeygen(w io.Writer, out, host string) error {
	comment := "gitfleet-controller"
	if host != "" {
		comment = "gitfleet-agent@" + host
	}
	private, public, err := trust.GenerateKey(comment)
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	if err := writeNew(out, private, 0o600, "give another --out"); err != nil {
		return err
	}
	if err := writeNew(out+".pub", []byte(public+"\n"), 0o644, "give another --out"); err != nil {
		os.Remove(out)
		return err
	}
	fmt.Fprintf(w, "Public key: %s\nPrivate key written to %s (mode 0600; it stays on this machine), the public key to %s.pub.\n\nSetup:\n", public, out, out)
	if host == "" {
		fmt.Fprintf(w, `  1. On the controller's machine, hand the key to the unit as a credential (systemctl edit
     gitfleet-controller) and restart it:
       [Service]
       LoadCredential=signing-key:%[2]s
       Environment=GITFLEET_SIGNING_KEY=%%d/signing-key
     (not run by systemd: --signing-key %[2]s, the file owned by the controller's user.)
     Its snapshots and status commits are signed from its next pass on.
  2. Then on every host, in the agent's configuration (/etc/gitfleet/agent.yaml), and restart the agent:
       controllerKeys:
         - %[1]s
     The agent then accepts only snapshots signed by a key of this list. When rotating, list
     the new key beside the old one on every host first, then move the controller to the new
     key, then drop the old one.
  3. To check a snapshots commit by hand:
       echo "gitfleet-controller %[1]s" > controller_signers
       git -c gpg.ssh.allowedSignersFile=controller_signers verify-commit origin/gitfleet/snapshots
`, public, out)
		return nil
	}
	fmt.Fprintf(w, `  1. On %[3]s, in the agent's configuration (/etc/gitfleet/agent.yaml), then restart the agent:
       signingKey: %[2]s
     Its status commits on gitfleet/hosts/%[3]s are signed from then on.
  2. Then in the fleet repository, in the Host object of %[3]s (a reviewed pull request):
       spec:
         agentKey: %[1]s
     The controller then finalizes deletes on %[3]s only on acks signed by this key; an
     unsigned or otherwise signed ack is reported under "Forged acks" in the status README.
`, public, out, host)
	return nil
}

// writeNew writes data to a new file path with mode perm, whatever the
// process umask (main's 077 would make a public key 0600); an existing
// file is an error, never overwritten, and hint says what to do instead.
// A failed write leaves no file behind.
func writeNew(path string, data []byte, perm os.FileMode, hint string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return &exitError{code: 1, err: fmt.Errorf("%s exists; it is never overwritten (%s)", path, hint)}
		}
		return &exitError{code: 1, err: err}
	}
	err = f.Chmod(perm)
	if err == nil {
		_, err = f.Write(data)
	}
	if err != nil {
		f.Close()
		os.Remove(path)
		return &exitError{code: 1, err: err}
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return &exitError{code: 1, err: err}
	}
	return nil
}
