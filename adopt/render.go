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
func (p *Plan) Path(dir string) string { return objectPath(dir, "vms", p.Name) }

// Files are the objects' files for the fleet repository under dir: the
// VM's (Path, Render) and one per volume (dir/volumes/<name>.yaml).
func (p *Plan) Files(dir string) (map[string][]byte, error) {
	vm, err := p.Render()
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{p.Path(dir): vm}
	for _, v := range p.Volumes {
		body, err := encodeYAML(volumeFile{APIVersion: desired.APIVersion, Kind: desired.KindVolume, Metadata: vmMeta{Name: v.Name},
			Spec: desired.VolumeSpec{Host: p.Spec.Host, SizeGB: v.SizeGB}})
		if err != nil {
			return nil, fmt.Errorf("render volume %s: %w", v.Name, err)
		}
		out[objectPath(dir, "volumes", v.Name)] = append([]byte("# Imported by gitfleet import with VM "+p.Name+": a disk it had, adopted as a volume.\n"), body...)
	}
	return out, nil
}

// volumeFile is the on-disk shape of a Volume object.
type volumeFile struct {
	APIVersion string             `yaml:"apiVersion"`
	Kind       desired.Kind       `yaml:"kind"`
	Metadata   vmMeta             `yaml:"metadata"`
	Spec       desired.VolumeSpec `yaml:"spec"`
}

// encodeYAML encodes v with two-space indents.
func encodeYAML(v any) ([]byte, error) {
	var body bytes.Buffer
	enc := yaml.NewEncoder(&body)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return body.Bytes(), nil
}

// objectPath is dir/kind/name.yaml ("" or "." for the root).
func objectPath(dir, kind, name string) string {
	p := kind + "/" + name + ".yaml"
	if dir == "" || dir == "." {
		return p
	}
	return strings.TrimSuffix(dir, "/") + "/" + p
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
	body, err := encodeYAML(vmFile{APIVersion: desired.APIVersion, Kind: desired.KindVM, Metadata: vmMeta{Name: p.Name}, Spec: p.Spec})
	if err != nil {
		return nil, fmt.Errorf("render %s: %w", p.Name, err)
	}
	out := string(body)
	if p.Spec.MAC != "" {
		// Quoted: a YAML 1.1 reader takes 52:54:00:… for a base-60 number.
		out = strings.Replace(out, "\n  mac: "+p.Spec.MAC+"\n", "\n  mac: \""+p.Spec.MAC+"\"\n", 1)
	}
	b.WriteString(out)
	return []byte(b.String()), nil
}
