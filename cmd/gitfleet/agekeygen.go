package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/gitfleet/gitfleet/internal/sealed"
)

// defaultAgeIdentity is where age-keygen writes a host's identity unless
// told otherwise, and the path its setup text names.
const defaultAgeIdentity = "/etc/gitfleet/age.key"

func newAgeKeygenCmd() *cobra.Command {
	var out, host string
	cmd := &cobra.Command{
		Use:   "age-keygen [--out FILE] [--host HOST]",
		Short: "Make a host's age identity, which opens the user-data encrypted to it",
		Long: `Age-keygen makes a new age X25519 identity for a host's agent and writes it
to --out (default ` + defaultAgeIdentity + `), mode 0600, refusing to overwrite
an existing file. It prints the public key (the recipient) and the exact
setup: the line for the agent's configuration and the field for the Host
object. The identity file is age-keygen's own format, so age's tools read
it, and "age-keygen -o FILE" makes an equivalent one.

To rotate a host's key, append a new identity to the same file (keep the
old one until every VM's user-data is encrypted to the new recipient), then
change the Host's spec.ageRecipient and re-encrypt in one pull request.`,
		Args: noArgs("age-keygen"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAgeKeygen(cmd.OutOrStdout(), out, host)
		},
	}
	cmd.Flags().StringVar(&out, "out", defaultAgeIdentity, "identity file to write (mode 0600; never overwritten)")
	cmd.Flags().StringVar(&host, "host", "HOST", "the host's name, for the setup printed")
	return cmd
}

func runAgeKeygen(w io.Writer, out, host string) error {
	file, recipient, err := sealed.Generate()
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	if err := writeNew(out, []byte(file), 0o600, "append a new key to rotate: see gitfleet age-keygen --help"); err != nil {
		return err
	}
	fmt.Fprintf(w, `Public key: %[1]s
Identity written to %[2]s (mode 0600; back it up: without it this host cannot open its VMs' user-data).

Setup:
  1. On the host, in the agent's configuration (/etc/gitfleet/agent.yaml), then restart the agent:
       ageIdentity: %[2]s
  2. In the fleet repository, in the Host object of %[3]s:
       spec:
         ageRecipient: %[1]s
  3. For each VM on %[3]s whose user-data holds a secret, in a clone of the fleet repository:
       gitfleet encrypt --host %[3]s vms/NAME.yaml
     and commit the encrypted file (never the plaintext).
`, recipient, out, host)
	return nil
}
