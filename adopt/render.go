package adopt

import (
	"bytes"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/gitfleet/gitfleet/desired"
)

// vmFile is the on-disk shape of the VM object Render writes.
type vmFile struct {
	APIVersion string         `yaml:"apiVersion"`
	Kind       desired.Kind   `yaml:"kind"`
	Metadata   vmMeta         `yaml:"metadata"`
	Spec       desired.VMSpec `yaml:"spec"`
}

type vmMeta struct {
	Name string `yaml:"name"`
}

// Path is where the VM object goes in the fleet repository, under dir
// (the objects' directory, "" for the root): dir/vms/<name>.yaml.
func (p *Plan) Path(dir string) string {
	name := "vms/" + p.Name + ".yaml"
	if dir == "" || dir == "." {
		return name
	}
	return strings.TrimSuffix(dir, "/") + "/" + name
}

// Render is the VM object's file: a comment with the report (what was
// mapped and what not, for the review; without the host paths Lines
// name), then the object. It names no host path: the agent finds the
// disk by the VM's name on its host.
func (p *Plan) Render() ([]byte, error) {
	var b strings.Builder
	b.WriteString("# Imported by gitfleet import. What the source had and what became of it:\n")
	for _, l := range p.Report {
		b.WriteString("#   " + strings.ReplaceAll(l.text(), "\n", " ") + "\n")
	}
	var body bytes.Buffer
	enc := yaml.NewEncoder(&body)
	enc.SetIndent(2)
	if err := enc.Encode(vmFile{APIVersion: desired.APIVersion, Kind: desired.KindVM, Metadata: vmMeta{Name: p.Name}, Spec: p.Spec}); err != nil {
		return nil, fmt.Errorf("render %s: %w", p.Name, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("render %s: %w", p.Name, err)
	}
	out := body.String()
	if p.Spec.MAC != "" {
		// Quoted: a YAML 1.1 reader takes 52:54:00:… for a base-60 number.
		out = strings.Replace(out, "\n  mac: "+p.Spec.MAC+"\n", "\n  mac: \""+p.Spec.MAC+"\"\n", 1)
	}
	b.WriteString(out)
	return []byte(b.String()), nil
}
