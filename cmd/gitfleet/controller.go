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
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"

	"github.com/gitfleet/gitfleet/cmd/gitfleet/internal/config"
	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/internal/httpserve"
	"github.com/gitfleet/gitfleet/internal/redact"
	"github.com/gitfleet/gitfleet/internal/scratchdir"
)

// controllerLong is the help text of gitfleet controller.
const controllerLong = `The controller reads the desired state on --branch, publishes one snapshot
per host and ledger.yaml on the gitfleet/snapshots branch, reads every host's
status from its branch gitfleet/hosts/<host>, finalizes deletes acknowledged
there (or abandoned by offline hosts), and keeps the gitfleet/status branch:
README.md as the fleet summary and a copy of every host's status.

It runs a pass at once, then every --interval (jittered), whenever the
repository moves, on SIGHUP (gitfleet reconcile controller, systemctl
reload), and on a signed push webhook (--webhook-listen serves
POST /hooks/github, /hooks/gitea, /hooks/gitlab with the secret from
--webhook-secret or GITFLEET_WEBHOOK_SECRET; --listen serves GET /metrics
and /healthz, apart, so no flood of webhook clients starves them).

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
on acks whose status commit that key signed; others are reported as forged.`

func newControllerCmd() *cobra.Command {
	c := config.DefaultController()
	var once bool
	cmd := &cobra.Command{
		Use:   "controller --repo URL",
		Short: "Publish host snapshots from the desired branch and finalize deletes",
		Long:  controllerLong,
		Args:  cobra.NoArgs,
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

// runController serves /metrics and /healthz when c.Listen is set, the
// webhooks when c.WebhookListen is, and runs the controller's loop until
// ctx ends.
func runController(ctx context.Context, ctl *fleet.Controller, c *config.Controller, log *logrus.Logger) error {
	srv, err := serveHTTP(ctl, c, log)
	if err != nil {
		return err
	}
	defer srv.Shutdown(context.Background())
	onReconcileSignal(ctx, ctl.Kick)
	err = ctl.Run(ctx, c.Interval)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// listeners are the controller's HTTP servers: /metrics and /healthz on
// one, the webhooks on another, each with its own caps (httpserve), so a
// flood of slow webhook clients never keeps the health check from
// answering. Either may be nil (not configured).
type listeners struct {
	ops, hooks *httpserve.Server
}

// Shutdown stops both.
func (l *listeners) Shutdown(ctx context.Context) {
	for _, s := range []*httpserve.Server{l.ops, l.hooks} {
		if s != nil {
			_ = s.Shutdown(ctx)
		}
	}
}

// webhookOptions bound the webhook listener: a push webhook is one short
// request, so fewer connections, fewer per client (behind a reverse proxy,
// the proxy is the one client) and a short wait for headers.
var webhookOptions = httpserve.Options{MaxConns: 64, MaxConnsPerClient: 16, ReadHeaderTimeout: 5 * time.Second}

// serveHTTP serves /metrics and /healthz on c.Listen and the webhooks on
// c.WebhookListen (each when set). /hooks/* on c.Listen answers 404,
// naming --webhook-listen, so a reverse proxy still pointed there says
// why.
func serveHTTP(ctl *fleet.Controller, c *config.Controller, log *logrus.Logger) (*listeners, error) {
	l := &listeners{}
	if c.Listen != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(ctl.Registry(), promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", ctl.Healthz)
		var warned atomic.Bool
		mux.HandleFunc("/hooks/", func(w http.ResponseWriter, _ *http.Request) {
			if !warned.Swap(true) {
				log.Warn("a webhook came to --listen, which serves only /metrics and /healthz: serve webhooks with --webhook-listen (and point the reverse proxy there)")
			}
			http.Error(w, "webhooks are served on the controller's --webhook-listen address", http.StatusNotFound)
		})
		srv, err := listen("--listen", c.Listen, mux, httpserve.Options{}, log)
		if err != nil {
			return nil, err
		}
		l.ops = srv
		log.WithField("addr", srv.Addr().String()).Info("serving /metrics and /healthz")
	}
	if c.WebhookListen != "" {
		if c.WebhookSecret == "" {
			log.Warn("no webhook secret: /hooks/* refuse every request")
		}
		srv, err := listen("--webhook-listen", c.WebhookListen, fleet.WebhookHandler([]byte(c.WebhookSecret), ctl.Kick), webhookOptions, log)
		if err != nil {
			l.Shutdown(context.Background())
			return nil, err
		}
		l.hooks = srv
		log.WithField("addr", srv.Addr().String()).Info("serving webhooks")
	}
	return l, nil
}

// listen serves h on addr (flag names it in errors) under opts.
func listen(flag, addr string, h http.Handler, opts httpserve.Options, log *logrus.Logger) (*httpserve.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, &exitError{code: 2, err: fmt.Errorf("%s %s: %w", flag, addr, err)}
	}
	srv := httpserve.NewServer(ln, h, opts)
	go func() {
		if err := srv.Serve(); err != nil {
			log.WithError(err).WithField("addr", addr).Error("http server")
		}
	}()
	return srv, nil
}
