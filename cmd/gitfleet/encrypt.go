package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/internal/sealed"
)

// encryptArgs are encrypt's settings: the VM file, the Host whose
// recipient to encrypt to, where the fleet's objects are, where the
// plaintext comes from, and whether to print instead of writing.
type encryptArgs struct {
	vmFile, host, repo, path, userData string
	stdout                             bool
}

func newEncryptCmd() *cobra.Command {
	a := encryptArgs{repo: "."}
	cmd := &cobra.Command{
		Use:   "encrypt [--host HOST] [--user-data FILE|-] VMFILE",
		Short: "Encrypt a VM's user-data to its host's age key, in the VM file",
		Long: `Encrypt replaces spec.cloudInit.userData of the VM object file VMFILE with
spec.cloudInit.encryptedUserData: the same user-data encrypted with age to
the recipient its Host names (spec.ageRecipient of the Host object in the
fleet at --repo/--path). Only that host's agent can decrypt it, when it
builds the VM's seed; the controller, the snapshots branch, plan and status
carry ciphertext only.

The plaintext is the file's own userData, or --user-data FILE (- reads
standard input), which also re-encrypts an encryptedUserData (to a Host's
new key, say). It is checked as cloud-init reads it first (as validate
checks userData). Every other line of VMFILE is left as it was; the file
is rewritten in place, or printed with --stdout. Commit only the encrypted
file: plaintext that was ever committed stays in the repository's history.

--host defaults to the VM's spec.host and must name it.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return &exitError{code: 2, err: fmt.Errorf("encrypt takes one VM file, got %d arguments", len(args))}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			a.vmFile = args[0]
			return runEncrypt(cmd.InOrStdin(), cmd.OutOrStdout(), a)
		},
	}
	cmd.Flags().StringVar(&a.host, "host", "", "the Host to encrypt to (default: the VM's spec.host)")
	cmd.Flags().StringVar(&a.repo, "repo", a.repo, "the fleet's checkout, whose Host object names the recipient")
	cmd.Flags().StringVar(&a.path, "path", "", "directory of the objects in --repo")
	cmd.Flags().StringVar(&a.userData, "user-data", "", "read the plaintext user-data from FILE (- for standard input) instead of the VM file's userData")
	cmd.Flags().BoolVar(&a.stdout, "stdout", false, "print the encrypted VM file instead of rewriting it")
	return cmd
}

func runEncrypt(stdin io.Reader, out io.Writer, a encryptArgs) error {
	data, err := os.ReadFile(a.vmFile)
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	vm, err := desired.DecodeVMFile(a.vmFile, data)
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	host := vm.Spec.Host
	switch {
	case a.host != "" && host != "" && a.host != host:
		return &exitError{code: 2, err: fmt.Errorf("VM %s runs on host %s (spec.host), not %s: its user-data must be encrypted to the host that runs it", vm.Metadata.Name, host, a.host)}
	case host == "":
		return &exitError{code: 1, err: fmt.Errorf("%s: the VM names no spec.host", a.vmFile)}
	}
	plain, err := encryptPlaintext(stdin, a, vm)
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	if len(plain) > sealed.MaxPlaintext {
		return &exitError{code: 1, err: fmt.Errorf("user-data is more than %d bytes; at most that is encrypted", sealed.MaxPlaintext)}
	}
	if probs := desired.CheckUserData(plain); len(probs) > 0 {
		var b strings.Builder
		for _, p := range probs {
			if p.Line > 0 {
				fmt.Fprintf(&b, "\n  user-data line %d: %s", p.Line, p.Msg)
			} else {
				fmt.Fprintf(&b, "\n  user-data: %s", p.Msg)
			}
		}
		return &exitError{code: 1, err: fmt.Errorf("cloud-init would not run this user-data as written; nothing was encrypted:%s", b.String())}
	}
	recipient, hostFile, err := desired.FindHostRecipient(desired.DirTree(filepath.Join(a.repo, a.path)), host)
	if err != nil {
		return &exitError{code: 1, err: fmt.Errorf("recipient of host %s in %s: %w", host, filepath.Join(a.repo, a.path), err)}
	}
	ct, err := sealed.Seal(recipient, vm.Metadata.Name, plain) // past the size check, only the recipient can be wrong
	if err != nil {
		return &exitError{code: 1, err: fmt.Errorf("%s: spec.ageRecipient: %w", hostFile, err)}
	}
	res, err := desired.SetEncryptedUserData(a.vmFile, data, desired.EncryptedUserData{Recipient: recipient, Ciphertext: ct})
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	if a.stdout {
		_, err := out.Write(res)
		return err
	}
	if err := writeInPlace(a.vmFile, res); err != nil {
		return &exitError{code: 1, err: err}
	}
	fmt.Fprintf(out, "%s: spec.cloudInit.encryptedUserData: %d bytes of user-data encrypted to host %s (%s, from %s); commit the file\n",
		a.vmFile, len(plain), host, recipient, hostFile)
	return nil
}

// encryptPlaintext is the user-data to encrypt: --user-data's file or
// standard input, else the VM file's own userData.
func encryptPlaintext(stdin io.Reader, a encryptArgs, vm *desired.VM) ([]byte, error) {
	switch {
	case a.userData == "-":
		b, err := io.ReadAll(io.LimitReader(stdin, sealed.MaxPlaintext+1))
		if err != nil {
			return nil, fmt.Errorf("read user-data from standard input: %w", err)
		}
		return b, nil
	case a.userData != "":
		f, err := os.Open(a.userData)
		if err != nil {
			return nil, fmt.Errorf("read user-data: %w", err)
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, sealed.MaxPlaintext+1))
		if err != nil {
			return nil, fmt.Errorf("read user-data: %w", err)
		}
		return b, nil
	case vm.Spec.CloudInit != nil && vm.Spec.CloudInit.UserData != "":
		return []byte(vm.Spec.CloudInit.UserData), nil
	case vm.Spec.CloudInit != nil && vm.Spec.CloudInit.EncryptedUserData != nil:
		return nil, errors.New("the VM's user-data is encrypted already; give the plaintext with --user-data FILE to encrypt it again")
	}
	return nil, errors.New("the VM has no spec.cloudInit.userData to encrypt; give one with --user-data FILE")
}

// writeInPlace replaces path's content with data, keeping its mode: a
// temporary file beside it, renamed over it.
func writeInPlace(path string, data []byte) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(fi.Mode().Perm()); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
