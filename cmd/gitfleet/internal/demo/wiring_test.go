package demo

import (
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/cmd/gitfleet/internal/config"
)

// The demo's controller and agent start from the commands' defaults
// (package config), so a default added there reaches the demo; only what
// the demo needs differently is set.
func TestDemoWiringStartsFromTheCommandsDefaults(t *testing.T) {
	l := Layout{Dir: "/d"}
	cfg := Config{Accel: "tcg", Version: "v1", TickInterval: time.Second, PollInterval: 2 * time.Second,
		Heartbeat: 3 * time.Second, TombstoneGrace: time.Minute}

	cc := controllerConfig(l, "file:///d/fleet.git")
	want := config.DefaultController()
	want.Repo.URL, want.CacheDir = "file:///d/fleet.git", l.ControllerCache()
	if cc != want {
		t.Errorf("controller config %+v, want the defaults with the repository and cache: %+v", cc, want)
	}

	ac := agentConfig(cfg, l, "file:///d/fleet.git")
	def := config.DefaultAgent()
	if ac.VMTimeout != def.VMTimeout || ac.VMTimeout == 0 {
		t.Errorf("VM watchdog %s, want the agent's default %s", ac.VMTimeout, def.VMTimeout)
	}
	if ac.Backend != config.BackendQEMU || ac.LogLevel != def.LogLevel {
		t.Errorf("backend %q, log level %s: want the agent's defaults", ac.Backend, ac.LogLevel)
	}
	for name, got := range map[string]any{
		"host": ac.Host == HostName, "version": ac.Version == "v1", "accel": ac.QEMU.Accel == "tcg",
		"state": ac.StateDir == l.State(), "git cache": ac.GitCacheDir == l.AgentCache(), "image cache": ac.ImageCacheDir == l.ImageCache(),
		"QEMU's user": ac.QEMU.RunAs == def.QEMU.RunAs, "no systemd scope": !ac.QEMU.SystemdScope,
		"file roots": len(ac.Artifacts.FileRoots) == 1 && ac.Artifacts.FileRoots[0] == l.Images(),
		"intervals":  ac.TickInterval == time.Second && ac.PollInterval == 2*time.Second && ac.Heartbeat == 3*time.Second,
		"grace":      ac.TombstoneGrace == time.Minute,
	} {
		if got != true {
			t.Errorf("agent config: %s not the demo's: %+v", name, ac)
		}
	}
}
