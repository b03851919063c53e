package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"

	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/internal/redact"
)

// repoFlags are the flags that name a remote repository and its
// credentials, shared by controller, plan and status. Each falls back to a
// GITFLEET_* environment variable.
type repoFlags struct {
	url        string
	token      string
	sshKey     string
	knownHosts string
}

func (f *repoFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.url, "repo", os.Getenv("GITFLEET_REPO"), "fleet repository: URL (file, http(s), ssh) or local path ($GITFLEET_REPO)")
	cmd.Flags().StringVar(&f.token, "token", "", "token for an http(s) remote; better set $GITFLEET_TOKEN, which stays off the command line")
	cmd.Flags().StringVar(&f.sshKey, "ssh-key", os.Getenv("GITFLEET_SSH_KEY"), "private key file for an ssh remote ($GITFLEET_SSH_KEY)")
	cmd.Flags().StringVar(&f.knownHosts, "known-hosts", os.Getenv("GITFLEET_KNOWN_HOSTS"), "known_hosts file for an ssh remote (default ~/.ssh/known_hosts; $GITFLEET_KNOWN_HOSTS)")
}

// auth returns the credentials; the token is read from the environment
// when the flag is empty, so it need not appear on a command line.
func (f *repoFlags) auth() gitsource.Auth {
	tok := f.token
	if tok == "" {
		tok = os.Getenv("GITFLEET_TOKEN")
	}
	return gitsource.Auth{Token: tok, SSHKeyFile: f.sshKey, KnownHostsFile: f.knownHosts}
}

func (f *repoFlags) check() error {
	if f.url == "" {
		return &exitError{code: 2, err: errors.New("--repo is required (or set GITFLEET_REPO)")}
	}
	return nil
}

// envDuration is the duration in environment variable name, or def.
func envDuration(name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func init() {
	var (
		repo                       repoFlags
		branch, path, cacheDir     string
		listen, secret             string
		once                       bool
		interval, grace, offline   time.Duration
		gitTimeout                 time.Duration
		snapshotsBranch, statusBra string
	)
	cmd := &cobra.Command{
		Use:   "controller --repo URL",
		Short: "Publish host snapshots from the desired branch and finalize deletes",
		Long: `The controller reads the desired state on --branch, publishes one snapshot
per host and ledger.yaml on the gitfleet/snapshots branch, finalizes deletes
acknowledged on the gitfleet/status branch (or abandoned by offline hosts),
and keeps README.md there as the fleet summary.

It runs a pass at once, then every --interval (jittered), whenever the
repository moves, and on a signed push webhook (--listen serves
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
belongs to another branch or path, an epoch past the bound); in all three
the last good snapshots stay. 2 for usage errors (overlapping branches, a
path outside the repository).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := repo.check(); err != nil {
				return err
			}
			if secret == "" {
				secret = os.Getenv("GITFLEET_WEBHOOK_SECRET")
			}
			log := redact.Logger(logrus.StandardLogger())
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// A clone in memory would hold every blob of the repository,
			// however large, a forged one on a gitfleet branch too: the
			// clones are on disk, in a private directory of this process
			// unless --cache-dir keeps the main one between runs.
			tmp, err := os.MkdirTemp("", "gitfleet-controller-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tmp)
			clone := cacheDir
			if clone == "" {
				clone = filepath.Join(tmp, "cache")
			}
			c, err := fleet.New(fleet.Config{
				URL: repo.url, Auth: repo.auth(), CacheDir: clone, TipsCacheDir: filepath.Join(tmp, "tips"),
				Branch: branch, Path: path, SnapshotsBranch: snapshotsBranch, StatusBranch: statusBra,
				AbandonGrace: grace, OfflineAfter: offline, GitTimeout: gitTimeout,
				Logger: logrus.NewEntry(log),
			})
			if errors.Is(err, fleet.ErrConfig) {
				return &exitError{code: 2, err: err}
			}
			if err != nil {
				return err
			}
			if once {
				res, err := c.Pass(ctx)
				switch fleet.PassOutcome(res, err) {
				case fleet.OutcomeUnreadable:
					return &exitError{code: 1, err: fmt.Errorf("unreadable: git failed; the last good snapshots stay: %w", err)}
				case fleet.OutcomeRefused:
					return &exitError{code: 1, err: fmt.Errorf("refused: the controller will not publish; the last good snapshots stay: %w", err)}
				}
				if res.Rejected != nil {
					return &exitError{code: 1, err: fmt.Errorf("desired state at %s rejected; the last good snapshots stay:\n%w", res.Head, res.Rejected)}
				}
				fmt.Fprintf(cmd.OutOrStdout(), "applied %s: %d snapshot(s) published, %d delete(s) pending\n", res.Head, len(res.Published), res.Pending)
				return nil
			}
			if listen != "" {
				if secret == "" {
					log.Warn("no webhook secret: /hooks/* refuse every request")
				}
				mux := http.NewServeMux()
				mux.Handle("/hooks/", fleet.WebhookHandler([]byte(secret), c.Kick))
				mux.Handle("/metrics", promhttp.HandlerFor(c.Registry(), promhttp.HandlerOpts{}))
				ln, err := net.Listen("tcp", listen)
				if err != nil {
					return &exitError{code: 2, err: fmt.Errorf("--listen %s: %w", listen, err)}
				}
				srv := fleet.NewServer(ln, mux, fleet.ServerOptions{})
				go func() {
					if err := srv.Serve(); err != nil {
						log.WithError(err).Error("http server")
					}
				}()
				defer srv.Shutdown(context.Background())
				log.WithField("addr", ln.Addr().String()).Info("serving webhooks and metrics")
			}
			err = c.Run(ctx, interval)
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		},
	}
	repo.add(cmd)
	f := cmd.Flags()
	f.StringVar(&branch, "branch", envOr("GITFLEET_BRANCH", fleet.DefaultBranch), "branch holding the desired state ($GITFLEET_BRANCH)")
	f.StringVar(&path, "path", os.Getenv("GITFLEET_PATH"), "directory of the objects in the repository; default the root ($GITFLEET_PATH)")
	f.StringVar(&cacheDir, "cache-dir", os.Getenv("GITFLEET_CACHE_DIR"), "directory for the local clone, kept between runs; default a private temporary directory removed at exit ($GITFLEET_CACHE_DIR)")
	f.BoolVar(&once, "once", false, "run one pass and exit")
	f.DurationVar(&interval, "interval", envDuration("GITFLEET_INTERVAL", fleet.DefaultInterval), "poll interval, jittered ($GITFLEET_INTERVAL)")
	f.StringVar(&listen, "listen", os.Getenv("GITFLEET_LISTEN"), "address for webhooks and /metrics, such as "+fleet.DefaultListen+"; off when empty ($GITFLEET_LISTEN)")
	f.StringVar(&secret, "webhook-secret", "", "webhook secret (default $GITFLEET_WEBHOOK_SECRET)")
	f.DurationVar(&grace, "abandon-grace", envDuration("GITFLEET_ABANDON_GRACE", fleet.DefaultAbandonGrace), "how long a delete waits on an offline host before the controller finalizes it")
	f.DurationVar(&gitTimeout, "git-timeout", envDuration("GITFLEET_GIT_TIMEOUT", gitsource.DefaultTimeout), "bound of each git operation (fetch, ls-remote, push) on every transport ($GITFLEET_GIT_TIMEOUT)")
	f.DurationVar(&offline, "offline-after", envDuration("GITFLEET_OFFLINE_AFTER", fleet.DefaultOfflineAfter), "no status change for this long makes a host offline")
	f.StringVar(&snapshotsBranch, "snapshots-branch", fleet.DefaultSnapshotsBranch, "branch the snapshots are published on")
	f.StringVar(&statusBra, "status-branch", fleet.DefaultStatusBranch, "branch the agents report on")
	rootCmd.AddCommand(cmd)
}
