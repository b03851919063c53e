package fleet

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gitfleet/gitfleet/snapshots"
)

// metrics are the controller's Prometheus series:
//
//	gitfleet_controller_passes_total{result}     passes by Outcome: published, unchanged, skipped, rejected, unreadable, refused
//	gitfleet_controller_rejected_commits_total   invalid desired-state commits (each distinct commit and reason once; never a git failure)
//	gitfleet_controller_tombstones_pending       pending deletes after the last pass
//	gitfleet_controller_retained                 objects kept after a history rewrite (never tombstoned)
//	gitfleet_controller_finalized_total{how}     deletes finalized: ack or sweep
//	gitfleet_controller_host_epoch{host}         last epoch published per host
//	gitfleet_controller_pass_seconds             pass duration
//	gitfleet_controller_git_seconds{op}          git operations' durations: fetch (desired, status), push (snapshots, status README)
//	gitfleet_controller_git_errors_total{op}     failed git operations (a missing branch is an answer, not a failure)
//	gitfleet_controller_hosts_held               hosts whose snapshot the last pass held (epoch at the bound)
//	gitfleet_controller_statuses_ignored         status files of hosts neither desired nor in the ledger, last pass
//	gitfleet_controller_forged_acks              acks not acted on in the last pass: status commit not signed by the Host's agentKey
//	gitfleet_controller_forged_snapshots_commits_total  snapshots commits found above the newest one a controller key signed (never acted on, written over)
type metrics struct {
	passes        *prometheus.CounterVec
	rejected      prometheus.Counter
	pending       prometheus.Gauge
	retained      prometheus.Gauge
	finalized     *prometheus.CounterVec
	epochs        *prometheus.GaugeVec
	duration      prometheus.Histogram
	git           *prometheus.HistogramVec
	gitErrors     *prometheus.CounterVec
	held          prometheus.Gauge
	ignored       prometheus.Gauge
	forgedAcks    prometheus.Gauge
	forgedCommits prometheus.Counter
	lastRejected  string
	// countedForged are the forged snapshots commits counted already.
	countedForged map[string]bool
}

// Git operations, the op label of gitfleet_controller_git_seconds and
// gitfleet_controller_git_errors_total (the agent's names).
const (
	GitFetch = "fetch"
	// GitPush is a compare-and-swap write: the fetch of the tip, the
	// commit and the push, with their retries.
	GitPush = "push"
)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gitfleet_controller_passes_total",
			Help: "Controller passes by outcome (published, unchanged, skipped, rejected, unreadable, refused)."}, []string{"result"}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "gitfleet_controller_rejected_commits_total",
			Help: "Invalid desired-state commits rejected; the last good snapshots stayed. Git failures are not counted here."}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gitfleet_controller_tombstones_pending",
			Help: "Deletes published and not yet finalized."}),
		retained: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gitfleet_controller_retained",
			Help: "Objects a history rewrite dropped from the desired state, kept instead of deleted."}),
		finalized: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gitfleet_controller_finalized_total",
			Help: "Deletes finalized, by an ack of the host or by the abandoned-host sweep."}, []string{"how"}),
		epochs: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gitfleet_controller_host_epoch",
			Help: "Last snapshot epoch published per host."}, []string{"host"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gitfleet_controller_pass_seconds",
			Help: "Duration of controller passes in seconds.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gitfleet_controller_hosts_held",
			Help: "Hosts whose snapshot the last pass held because their epoch is at the bound; the others published."}),
		ignored: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gitfleet_controller_statuses_ignored",
			Help: "Status files of hosts neither in the desired state nor in the ledger, ignored by the last pass."}),
		forgedAcks: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gitfleet_controller_forged_acks",
			Help: "Acks the last pass did not act on: the host's status commit is not signed by the key its Host's spec.agentKey names; their deletes stay pending."}),
		forgedCommits: prometheus.NewCounter(prometheus.CounterOpts{Name: "gitfleet_controller_forged_snapshots_commits_total",
			Help: "Commits found on the snapshots branch above the newest one a controller key signed: their ledger and files were never acted on, and the controller wrote over them (needs a signing key)."}),
		countedForged: map[string]bool{},
		git: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gitfleet_controller_git_seconds",
			Help:    "Duration of git operations (fetch of the desired and status branches, push of snapshots and the status README) in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}, []string{"op"}),
		gitErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gitfleet_controller_git_errors_total",
			Help: "Failed git operations (fetch, push)."}, []string{"op"}),
	}
	for _, op := range []string{GitFetch, GitPush} {
		m.git.WithLabelValues(op)
		m.gitErrors.WithLabelValues(op)
	}
	for _, c := range []prometheus.Collector{m.passes, m.rejected, m.pending, m.retained, m.finalized, m.epochs, m.duration, m.held, m.ignored, m.forgedAcks, m.forgedCommits, m.git, m.gitErrors} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register controller metrics: %w", err)
		}
	}
	return m, nil
}

// gitOp records one git operation: its duration, and an error when git
// failed (failed is false for a success and for an answer such as a
// missing branch).
func (m *metrics) gitOp(op string, d time.Duration, failed bool) {
	m.git.WithLabelValues(op).Observe(d.Seconds())
	if failed {
		m.gitErrors.WithLabelValues(op).Inc()
	}
}

func (m *metrics) observe(res PassResult, outcome Outcome, d time.Duration) {
	m.duration.Observe(d.Seconds())
	if outcome == OutcomeRejected {
		key := res.Head + "\x00" + res.Rejected.Error()
		if key != m.lastRejected {
			m.lastRejected = key
			m.rejected.Inc()
		}
	}
	m.passes.WithLabelValues(string(outcome)).Inc()
	for _, f := range res.ForgedCommits {
		if !m.countedForged[f.Commit] {
			if len(m.countedForged) >= snapshots.MaxForgedCommits {
				clear(m.countedForged)
			}
			m.countedForged[f.Commit] = true
			m.forgedCommits.Inc()
		}
	}
	if outcome == OutcomeUnreadable || outcome == OutcomeRefused || outcome == OutcomeSkipped {
		return
	}
	m.pending.Set(float64(res.Pending))
	m.held.Set(float64(len(res.Held)))
	m.ignored.Set(float64(len(res.IgnoredStatuses)))
	m.forgedAcks.Set(float64(len(res.ForgedAcks)))
	m.retained.Set(float64(res.RetainedTotal))
	m.finalized.WithLabelValues("ack").Add(float64(len(res.Finalized)))
	m.finalized.WithLabelValues("sweep").Add(float64(len(res.Swept)))
	for h, e := range res.Epochs {
		m.epochs.WithLabelValues(h).Set(float64(e))
	}
}
