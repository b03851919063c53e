package desired

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"go.yaml.in/yaml/v3"
)

// DecodeVMFile decodes data, the VM object file named file, strictly
// (Decode's rules: no unknown field, no duplicate key, no coercion). It
// checks the object's shape, not its values, nor the cross-object rules
// of Load; errors are an ErrorList at FILE:LINE:COL. The VM's Spec is the
// file's own: of a VM that names a profile (VM.Profile), it lacks what the
// profile gives.
func DecodeVMFile(file string, data []byte) (*VM, error) {
	var doc vmDoc
	if err := DecodeStrict(file, data, &doc); err != nil {
		return nil, err
	}
	if doc.Kind != string(KindVM) {
		return nil, fmt.Errorf("%s: kind is %q, not VM", file, doc.Kind)
	}
	return &VM{Metadata: doc.Metadata, Spec: doc.Spec.VMSpec, Profile: doc.Spec.Profile}, nil
}

// FindHostRecipient returns spec.ageRecipient of the Host object named
// host in t (every *.yaml / *.yml file Load would read; other objects are
// not validated, so a fleet that does not validate yet — a Host whose key
// just changed, say — still answers). It is an error when no Host of that
// name is found, when two are, or when the Host names no recipient.
func FindHostRecipient(t Tree, host string) (recipient, file string, err error) {
	found := 0
	err = t.Walk(func(f File) error {
		if (f.Mode != Regular && f.Mode != Executable) || !isYAML(f.Path) || hidden(f.Path) {
			return nil
		}
		data, err := f.Read()
		if err != nil {
			return err
		}
		var doc struct {
			Kind     string `yaml:"kind"`
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
			Spec struct {
				AgeRecipient string `yaml:"ageRecipient"`
			} `yaml:"spec"`
		}
		if yaml.Unmarshal(data, &doc) != nil || doc.Kind != string(KindHost) || doc.Metadata.Name != host {
			return nil
		}
		found++
		recipient, file = doc.Spec.AgeRecipient, f.Path
		return nil
	})
	switch {
	case err != nil:
		return "", "", err
	case found == 0:
		return "", "", fmt.Errorf("no Host %q found", host)
	case found > 1:
		return "", "", fmt.Errorf("Host %q is defined %d times", host, found)
	case recipient == "":
		return "", file, fmt.Errorf("Host %q (%s) names no spec.ageRecipient: set it to the public key its agent's identity holds (gitfleet age-keygen prints it)", host, file)
	}
	return recipient, file, nil
}

// SetEncryptedUserData returns the VM object file data with enc written as
// spec.cloudInit.encryptedUserData in place of spec.cloudInit.userData
// (or of an earlier encryptedUserData), and every other line as it was,
// so a pull request shows exactly the user-data's change. When the file
// has neither, encryptedUserData becomes the first field of
// spec.cloudInit (made when missing). The ciphertext is written as a
// literal block. The file's cloudInit and spec must be block mappings
// (not {flow}); the result is checked to decode back to enc with no
// plaintext userData, or an error is returned.
func SetEncryptedUserData(file string, data []byte, enc EncryptedUserData) ([]byte, error) {
	var root yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&root); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	if len(root.Content) != 1 || root.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: not a VM object file", file)
	}
	text := string(data)
	if !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	lines := strings.SplitAfter(text, "\n")
	lines = lines[:len(lines)-1] // the "" after the last line break
	spec := mappingValue(root.Content[0], "spec")
	if spec == nil || spec.Kind != yaml.MappingNode || spec.Style&yaml.FlowStyle != 0 || len(spec.Content) == 0 {
		return nil, fmt.Errorf("%s: spec must be a block mapping (one field per line)", file)
	}
	block := func(indent int, withCloudInit bool) []string {
		pad := strings.Repeat(" ", indent)
		var out []string
		if withCloudInit {
			out = append(out, pad+"cloudInit:\n")
			pad += "  "
		}
		out = append(out, pad+"encryptedUserData:\n", pad+"  recipient: "+enc.Recipient+"\n", pad+"  ciphertext: |\n")
		for _, l := range strings.SplitAfter(strings.TrimRight(enc.Ciphertext, "\n")+"\n", "\n") {
			if l != "" {
				out = append(out, pad+"    "+l)
			}
		}
		return out
	}
	var out []string
	ci := mappingValue(spec, "cloudInit")
	switch {
	case ci == nil:
		first := spec.Content[0]
		at := first.Line - 1
		out = splice(lines, at, at, block(first.Column-1, true))
	case ci.Kind != yaml.MappingNode || ci.Style&yaml.FlowStyle != 0 || len(ci.Content) == 0:
		return nil, fmt.Errorf("%s: spec.cloudInit must be a block mapping (one field per line)", file)
	default:
		var keys []*yaml.Node
		for i := 0; i+1 < len(ci.Content); i += 2 {
			if k := ci.Content[i].Value; k == "userData" || k == "encryptedUserData" {
				keys = append(keys, ci.Content[i])
			}
		}
		out = lines
		if len(keys) == 0 {
			first := ci.Content[0]
			out = splice(lines, first.Line-1, first.Line-1, block(first.Column-1, false))
			break
		}
		// Replace from the last to the first, so earlier line numbers hold.
		for i := len(keys) - 1; i >= 0; i-- {
			k := keys[i]
			from := k.Line - 1
			to := blockEnd(out, from, k.Column-1)
			var repl []string
			if i == 0 {
				repl = block(k.Column-1, false)
			}
			out = splice(out, from, to, repl)
		}
	}
	res := []byte(strings.Join(out, ""))
	vm, err := DecodeVMFile(file, res)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%s: the edited file does not decode (%v); edit it by hand", file, err)
	case vm.Spec.CloudInit == nil || vm.Spec.CloudInit.UserData != "" || vm.Spec.CloudInit.EncryptedUserData == nil ||
		*vm.Spec.CloudInit.EncryptedUserData != (EncryptedUserData{Recipient: enc.Recipient, Ciphertext: strings.TrimRight(enc.Ciphertext, "\n") + "\n"}):
		return nil, fmt.Errorf("%s: the edited file does not read back as the encrypted user-data; edit it by hand", file)
	}
	return res, nil
}

// mappingValue is the value of key in mapping node m, or nil.
func mappingValue(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// blockEnd is the index of the first line after the field whose key
// starts line from at column indent (0-based): the first later line that
// is not blank and is indented no deeper than the key. Blank lines just
// before it are left outside the field.
func blockEnd(lines []string, from, indent int) int {
	end := from + 1
	for i := from + 1; i < len(lines); i++ {
		t := strings.TrimRight(lines[i], "\r\n")
		if strings.TrimSpace(t) == "" {
			continue
		}
		if len(t)-len(strings.TrimLeft(t, " ")) <= indent {
			return end
		}
		end = i + 1
	}
	return end
}

// splice replaces lines[from:to] with repl.
func splice(lines []string, from, to int, repl []string) []string {
	out := append([]string(nil), lines[:from]...)
	out = append(out, repl...)
	return append(out, lines[to:]...)
}
