package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gitfleet/gitfleet/agent/qemu"
	"github.com/gitfleet/gitfleet/cmd/gitfleet/internal/config"
	"github.com/gitfleet/gitfleet/cmd/gitfleet/internal/demo"
)

func newDemoCmd() *cobra.Command {
	var keep bool
	cfg := demo.Config{Accel: qemu.AccelAuto}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Boot a small fleet of tiny VMs on this machine from a local git repository",
		Long: `demo creates a bare repository holding a small fleet (one host, two tiny VMs,
one volume), runs the controller and an agent against it with real QEMU, shows
the VMs' progress and, once their guests have booted, how to change the fleet
with a git push.

The guests boot a Debian kernel with a busybox initramfs, built once and
cached. The kernel is the one already downloaded into the cache, if any;
else this machine's own (/boot/vmlinuz-* with uncompressed modules in
/lib/modules) when it is readable; else the package linux-image-amd64
depends on, fetched once with apt-get download (the only network access). The cache (--cache) is, by default,
$XDG_CACHE_HOME/gitfleet/tinyguest (~/.cache/gitfleet/tinyguest); when that
holds no downloaded kernel but the test suite's cache
($XDG_CACHE_HOME/gitfleet-test/tinyguest) does, the demo uses that one. The
first progress line names the cache used.

Everything lives in --dir; running the demo again resumes it. Ctrl-C stops it
and shuts the VMs down (disks stay) unless --keep is given.`,
		Args: noArgs("demo"),
	}
	flags := demoFlags(cmd.Flags(), &cfg)
	cmd.Flags().BoolVar(&keep, "keep", false, "leave the VMs running when the demo stops")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := flags.FromEnv(config.OS); err != nil {
			return usageOr(err)
		}
		ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		self, err := os.Executable()
		if err != nil {
			self = "gitfleet"
		}
		cfg.Keep, cfg.Out, cfg.Command = keep, cmd.OutOrStdout(), self
		cfg.Version, _ = versions()
		err = demo.Run(ctx, cfg)
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	}
	cmd.SetContext(context.Background())
	return cmd
}

// demoFlags binds the demo's flags, with their variables, to cfg; cfg's
// values are their defaults.
func demoFlags(fs *pflag.FlagSet, cfg *demo.Config) *config.Flags {
	flags := config.NewFlags(fs)
	flags.Path(&cfg.Dir, "dir", "GITFLEET_DEMO_DIR", "directory for the demo's repository, disks and logs (default $XDG_STATE_HOME/gitfleet/demo or ~/.local/state/gitfleet/demo)")
	flags.Path(&cfg.CacheDir, "cache", "GITFLEET_DEMO_CACHE", "where the tiny guest is built and cached (default $XDG_CACHE_HOME/gitfleet/tinyguest, or the test suite's $XDG_CACHE_HOME/gitfleet-test/tinyguest when only that holds a downloaded kernel; see above)")
	flags.Choice(&cfg.Accel, "accel", "GITFLEET_ACCEL", "QEMU accelerator: auto, kvm or tcg", qemu.AccelAuto, qemu.AccelKVM, qemu.AccelTCG)
	return flags
}
