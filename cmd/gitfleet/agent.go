package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/signal"
	"syscall"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/cmd/gitfleet/internal/config"
	"github.com/gitfleet/gitfleet/internal/httpserve"
)

func newAgentCmd() *cobra.Command {
	var once bool
	cmd := &cobra.Command{
		Use:   "agent --config FILE",
		Short: "Run this host's agent: reconcile its VMs and volumes with its snapshot",
		Long: `Agent fetches this host's snapshot from the gitfleet/snapshots branch,
reconciles VMs and volumes toward it, and writes the host's status to its
own branch, gitfleet/hosts/<host>. --repo, --host and --state-dir override the config
file (environment: GITFLEET_CONFIG, GITFLEET_REPO, GITFLEET_HOST,
GITFLEET_STATE_DIR; GITFLEET_TOKEN supplies a token).

SIGTERM or SIGINT finishes the work under way, writes the status and exits 0;
VMs keep running. SIGHUP (gitfleet reconcile agent, systemctl reload) runs a
pass at once. --once runs one pass, waits for it, writes the status and
exits: 0 on success, 1 on failure.`,
		Args: noArgs("agent"),
	}
	flags := config.BindAgent(cmd.Flags())
	cmd.Flags().BoolVar(&once, "once", false, "run one pass, write the status and exit")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		c, err := flags.Load(config.OS)
		if err != nil {
			return usageOr(err)
		}
		c.Version, _ = versions()
		ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		return runAgent(ctx, c, once, cmd.ErrOrStderr())
	}
	return cmd
}

// runAgent wires the agent c configures and runs it: one pass with once,
// else until ctx ends, telling systemd it is ready and alive.
func runAgent(ctx context.Context, c *config.Agent, once bool, logOut io.Writer) error {
	parts, err := c.Open(ctx, c.Logger(logOut))
	if err != nil {
		return err
	}
	cfg := parts.Config
	if !once {
		notifySystemd(&cfg)
	}
	ag, err := agent.New(cfg)
	if err != nil {
		return err
	}
	if once {
		err := ag.Once(ctx)
		closeCtx, cancel := context.WithTimeout(context.Background(), agent.DefaultStopTimeout)
		defer cancel()
		parts.Engine.Close(closeCtx)
		return err
	}
	if c.Listen != "" {
		srv, err := serveAgentHTTP(c.Listen, ag, parts.Registry, cfg.Log)
		if err != nil {
			return err
		}
		defer srv.Shutdown(context.Background())
	}
	onReconcileSignal(ctx, ag.ReconcileNow)
	err = ag.Run(ctx)
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
	return err
}

// serveAgentHTTP serves /metrics (reg) and /healthz (ag) on addr.
func serveAgentHTTP(addr string, ag *agent.Agent, reg *prometheus.Registry, log logrus.FieldLogger) (*httpserve.Server, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", ag.Healthz)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, &exitError{code: 2, err: fmt.Errorf("listen %s: %w", addr, err)}
	}
	srv := httpserve.NewServer(ln, mux, httpserve.Options{})
	go func() {
		if err := srv.Serve(); err != nil {
			log.WithError(err).Error("http server")
		}
	}()
	log.WithField("addr", ln.Addr().String()).Info("serving /metrics and /healthz")
	return srv, nil
}

// notifySystemd makes the agent send READY=1 once its state is loaded,
// before any git operation, and ping the watchdog from the reconcile loop,
// on every tick, when systemd asks for it.
func notifySystemd(cfg *agent.Config) {
	cfg.Ready = func() { _, _ = daemon.SdNotify(false, daemon.SdNotifyReady) }
	if every, err := daemon.SdWatchdogEnabled(false); err == nil && every > 0 {
		cfg.AliveEvery = every / 3
		cfg.Alive = func() { _, _ = daemon.SdNotify(false, daemon.SdNotifyWatchdog) }
	}
}
