package config

import (
	"time"

	"github.com/spf13/pflag"
)

// Flags binds a command's flags to configuration fields, each flag with the
// environment variable that stands in for it when the flag is not given.
// Bind every flag, let the command line be parsed, then call FromEnv once.
type Flags struct {
	fs      *pflag.FlagSet
	vars    []boundVar
	fromEnv map[string]string // flag name → the variable that set it
}

type boundVar struct{ flag, env string }

// NewFlags binds flags on fs.
func NewFlags(fs *pflag.FlagSet) *Flags {
	return &Flags{fs: fs, fromEnv: map[string]string{}}
}

// String binds flag name, and the variable env ("" for none), to *p; the
// value *p holds now is the default.
func (f *Flags) String(p *string, name, env, usage string) {
	f.bind(&stringValue{p: p, kind: plainString}, name, env, usage)
}

// URL is String for a repository URL or local path (see checkURL).
func (f *Flags) URL(p *string, name, env, usage string) {
	f.bind(&stringValue{p: p, kind: urlString}, name, env, usage)
}

// Path is String for a file or directory path (see checkPath).
func (f *Flags) Path(p *string, name, env, usage string) {
	f.bind(&stringValue{p: p, kind: pathString}, name, env, usage)
}

// Choice is String for one of values.
func (f *Flags) Choice(p *string, name, env, usage string, values ...string) {
	f.bind(&stringValue{p: p, kind: stringKind{"string", oneOf(values...)}}, name, env, usage)
}

// Duration binds a duration of 0 or more.
func (f *Flags) Duration(p *time.Duration, name, env, usage string) {
	f.bind(&durationValue{p: p}, name, env, usage)
}

// Int binds an integer (negative allowed).
func (f *Flags) Int(p *int, name, env, usage string) {
	f.bind(&intValue{p: p}, name, env, usage)
}

// Bool binds a switch: --name alone is true.
func (f *Flags) Bool(p *bool, name, env, usage string) {
	f.bind(&boolValue{p: p}, name, env, usage)
	f.fs.Lookup(name).NoOptDefVal = "true"
}

func (f *Flags) bind(v pflag.Value, name, env, usage string) {
	if env != "" {
		usage += " ($" + env + ")"
	}
	f.fs.Var(v, name, usage)
	f.vars = append(f.vars, boundVar{flag: name, env: env})
}

// FromEnv sets each flag the command line did not give from its variable,
// when that is set and not empty. A malformed value is an *EnvError.
func (f *Flags) FromEnv(env Env) error {
	for _, b := range f.vars {
		fl := f.fs.Lookup(b.flag)
		if b.env == "" || fl.Changed {
			continue
		}
		s := env(b.env)
		if s == "" {
			continue
		}
		if err := fl.Value.Set(s); err != nil {
			return &EnvError{Var: b.env, Value: s, Flag: b.flag, Err: err}
		}
		f.fromEnv[b.flag] = b.env
	}
	return nil
}

// Origin names where flag name's value came from, for error messages:
// "--name", or its variable when FromEnv set it.
func (f *Flags) Origin(name string) string {
	if env, ok := f.fromEnv[name]; ok {
		return env
	}
	return "--" + name
}
