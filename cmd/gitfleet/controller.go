package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"

	"github.com/gitfleet/gitfleet/cmd/gitfleet/internal/config"
	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/internal/httpserve"
	"github.com/gitfleet/gitfleet/internal/redact"
	"github.com/gitfleet/gitfleet/internal/scratchdir"
)

func newControllerCmd() *cobra.Command {
	c := config.DefaultController()
	var once bool
	cmd := &cobra.Command{
		Use:   "controller --repo URL",
		Short: "Publish host snapshots from the desired branch and finalize deletes",
		Long: `The controller reads the desired state on --branch, publishes one snapshot
per host and ledger.yaml on the gitfleet/snapshots branch, reads every host's
status from its branch gitfleet/hosts/<host>, finalizes deletes acknowledged
there (or abandoned by offline hosts), and keeps the gitfleet/status branch:
README.md as the fleet summary and a copy of every host's status.

It runs a pass at once, then every --interval (jittered), whenever the
repository moves, on SIGHUP (gitfleet reconcile controller, systemctl
reload), and on a signed push webhook (--listen serves
POST /hooks/github, /hooks/gitea, /hooks/gitlab with the secret from
--webhook-secret or GITFLEET_WEBHOOK_SECRET, and GET /metrics).

The desired, snapshots and status branches must be three different
branches, and --path a directory inside the repository ("./fleet", "fleet/"
and "fleet" are the same). A controller whose --branch or --path differs
from the one the ledger on the snapshots branch was computed from refuses
to publish.

With --once it runs one pass and exits: 0 when it published or had nothing
to do, 1 when the desired state was rejected (the commit is invalid),
unreadable (git failed, or ran past --git-timeout) or refused (the ledger
belongs to another branch or path); in all three the last good snapshots
stay; 2 for usage errors (overlapping branches, a path outside the
repository, a malformed flag or environment variable, an allowed-signers
file or keyring that does not parse). A host whose epoch is at the bound
is held and logged; the others publish.

--verify-signatures head|every applies only commits signed by a key of
--allowed-signers (SSH, ssh-keygen -Y format) or --openpgp-keyring; any
other head is rejected. A change that newly tombstones more than
--max-deletes objects, or more than 25% of a host's VMs, is rejected
unless a commit carries the trailer "Gitfleet-Allow-Deletes: <n>".

--signing-key signs every snapshots commit the controller writes (never its
status commits) with an SSH key (gitfleet keygen --controller), as git -c
gpg.format=ssh commit -S would:
agents listing its public key in controllerKeys accept only snapshots
signed with it. For a Host naming spec.agentKey, deletes are finalized only
on acks whose status commit that key signed; others are reported as forged.`,
		Args: cobra.NoArgs,
	}
	flags := config.NewFlags(cmd.Flags())
	c.Bind(flags)
	cmd.Flags().BoolVar(&once, "once", false, "run one pass and exit")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := flags.FromEnv(config.OS); err != nil {
			return usageOr(err)
		}
		if err := c.Repo.Check(); err != nil {
			return usageOr(err)
		}
		log := redact.Logger(logrus.StandardLogger())
		fc, err := c.Fleet(logrus.NewEntry(log))
		if err != nil {
			return usageOr(err)
		}
		done, err := privateClones(&fc, logrus.NewEntry(log))
		if err != nil {
			return err
		}
		defer done()
		ctl, err := fleet.New(fc)
		if errors.Is(err, fleet.ErrConfig) {
			return &exitError{code: 2, err: err}
		}
		if err != nil {
			return err
		}
		defer ctl.Close() // its cache locks, for a next run in this process
		ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if once {
			return controllerOnce(ctx, ctl, cmd.OutOrStdout())
		}
		return runController(ctx, ctl, &c, log)
	}
	return cmd
}

// privateClones puts the controller's clones on disk: a clone in memory
// would hold every blob of the repository, however large, a forged one on
// a gitfleet branch too. They go in a private directory of this process,
// which done removes, unless --cache-dir keeps the main one between runs.
// The private directories of controllers that were killed (and so removed
// nothing) are swept first; a running controller's stays (see scratchdir).
func privateClones(fc *fleet.Config, log *logrus.Entry) (done func(), err error) {
	scratchdir.Sweep(controllerScratch, log)
	tmp, done, err := scratchdir.Make(controllerScratch)
	if err != nil {
		return nil, err
	}
	if fc.CacheDir == "" {
		fc.CacheDir = filepath.Join(tmp, "cache")
	}
	fc.TipsCacheDir = filepath.Join(tmp, "tips")
	return done, nil
}

// controllerScratch names the controller's private directories in the
// temporary directory.
const controllerScratch = "gitfleet-controller-"

// controllerOnce runs one pass and says what came of it.
func controllerOnce(ctx context.Context, ctl *fleet.Controller, out io.Writer) error {
	res, err := ctl.Pass(ctx)
	switch fleet.PassOutcome(res, err) {
	case fleet.OutcomeUnreadable:
		return &exitError{code: 1, err: fmt.Errorf("unreadable: git failed; the last good snapshots stay: %w", err)}
	case fleet.OutcomeRefused:
		return &exitError{code: 1, err: fmt.Errorf("refused: the controller will not publish; the last good snapshots stay: %w", err)}
	}
	if res.Rejected != nil {
		return &exitError{code: 1, err: fmt.Errorf("desired state at %s rejected; the last good snapshots stay:\n%w", res.Head, res.Rejected)}
	}
	fmt.Fprintf(out, "applied %s: %d snapshot(s) published, %d delete(s) pending\n", res.Head, len(res.Published), res.Pending)
	return nil
}

// runController serves the webhooks and metrics when c.Listen is set and
// runs the controller's loop until ctx ends.
func runController(ctx context.Context, ctl *fleet.Controller, c *config.Controller, log *logrus.Logger) error {
	if c.Listen != "" {
		srv, err := serveHTTP(ctl, c, log)
		if err != nil {
			return err
		}
		defer srv.Shutdown(context.Background())
	}
	onReconcileSignal(ctx, ctl.Kick)
	err := ctl.Run(ctx, c.Interval)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// serveHTTP serves the webhooks, /metrics and /healthz on c.Listen.
func serveHTTP(ctl *fleet.Controller, c *config.Controller, log *logrus.Logger) (*httpserve.Server, error) {
	if c.WebhookSecret == "" {
		log.Warn("no webhook secret: /hooks/* refuse every request")
	}
	mux := http.NewServeMux()
	mux.Handle("/hooks/", fleet.WebhookHandler([]byte(c.WebhookSecret), ctl.Kick))
	mux.Handle("/metrics", promhttp.HandlerFor(ctl.Registry(), promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", ctl.Healthz)
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return nil, &exitError{code: 2, err: fmt.Errorf("--listen %s: %w", c.Listen, err)}
	}
	srv := httpserve.NewServer(ln, mux, httpserve.Options{})
	go func() {
		if err := srv.Serve(); err != nil {
			log.WithError(err).Error("http server")
		}
	}()
	log.WithField("addr", ln.Addr().String()).Info("serving webhooks, /metrics and /healthz")
	return srv, nil
}
