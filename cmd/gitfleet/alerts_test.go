package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/fleet"
)

// The example alert rules name only metrics the controller and the agent
// export: a rule on a misspelt or renamed metric never fires, silently.
func TestExampleAlertRulesNameRealMetrics(t *testing.T) {
	data, err := os.ReadFile("../../examples/prometheus/gitfleet-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(false)
	if err := dec.Decode(&rules); err != nil {
		t.Fatal(err)
	}

	// Every metric the agent and the controller register, by the names
	// their collectors describe (a vector with no sample yet included).
	known := descNames{}
	if _, err := agent.NewMetrics(known); err != nil {
		t.Fatal(err)
	}
	if _, err := fleet.New(fleet.Config{URL: t.TempDir(), Registerer: known}); err != nil {
		t.Fatal(err)
	}
	metric := regexp.MustCompile(`gitfleet_[a-z_]+`)
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			names := metric.FindAllString(r.Expr, -1)
			if len(names) == 0 {
				t.Errorf("%s: expr %q names no gitfleet metric", r.Alert, r.Expr)
			}
			for _, name := range names {
				if !known.has(name) {
					t.Errorf("%s: %s is not a metric gitfleet exports", r.Alert, name)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no rules read")
	}
}

// descNames is a prometheus.Registerer that keeps the names its collectors
// describe.
type descNames map[string]bool

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d descNames) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		if m := fqName.FindStringSubmatch(desc.String()); m != nil {
			d[m[1]] = true
		}
	}
	return nil
}

func (d descNames) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = d.Register(c)
	}
}

func (d descNames) Unregister(prometheus.Collector) bool { return false }

// has reports whether name is a described metric or a histogram's series.
func (d descNames) has(name string) bool {
	for _, suffix := range []string{"", "_bucket", "_count", "_sum"} {
		if d[strings.TrimSuffix(name, suffix)] && strings.HasSuffix(name, suffix) {
			return true
		}
	}
	return false
}
