package agent

import (
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gitfleet/gitfleet/internal/safetext"
	"github.com/gitfleet/gitfleet/status"
)

// Metrics are the agent's Prometheus metrics (names gitfleet_agent_*). The
// engine's and the agent's code update the counters and histograms; the
// gauges of VMs by phase, the epoch and the fence are read from
// Engine.Report at each scrape, so they are never stale. Every method of a
// nil *Metrics does nothing, so the engine and the agent run without.
type Metrics struct {
	passes       prometheus.Histogram
	creates      *prometheus.CounterVec
	git          *prometheus.HistogramVec
	gitErrors    *prometheus.CounterVec
	imageBytes   prometheus.Gauge
	imageRemoved prometheus.Counter
	refusals     *prometheus.CounterVec
	// writeRefused is gitfleet_agent_status_write_refused: one series,
	// labelled with the remote's message, while the remote refuses the
	// status writes.
	writeRefused *prometheus.GaugeVec
	// lastTick is the Unix nanoseconds of the last tick the agent's
	// reconcile loop finished (LastTick).
	lastTick atomic.Int64
	// engine is the engine whose Report the gauges read; set by NewEngine.
	engine atomic.Pointer[Engine]
}

// DefaultListen is the address the documentation suggests for the
// agent's listener (/metrics, /healthz): loopback. The listener is off
// unless one is given.
const DefaultListen = "127.0.0.1:9781"

// Create outcomes, the result label of gitfleet_agent_create_attempts_total.
const (
	CreateOK     = "ok"
	CreateFailed = "failed"
)

// Git operations, the op label of gitfleet_agent_git_seconds and
// gitfleet_agent_git_errors_total.
const (
	GitFetch = "fetch"
	GitPush  = "push"
)

// Reasons a snapshots commit is refused, the reason label of
// gitfleet_agent_snapshot_refusals_total.
const (
	RefusedSignature = "signature"
	RefusedInvalid   = "invalid"
)

// NewMetrics registers the agent's metrics on reg. Give the result to
// EngineConfig.Metrics and Config.Metrics; the report-derived gauges read
// the engine made with it. An error is a name already registered on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		passes: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gitfleet_agent_vm_pass_seconds",
			Help: "Duration of one VM's reconcile pass in seconds.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)}),
		creates: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gitfleet_agent_create_attempts_total",
			Help: "VM create attempts by result (ok, failed)."}, []string{"result"}),
		git: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gitfleet_agent_git_seconds",
			Help:    "Duration of git operations (fetch of the snapshot, push of the status) in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}, []string{"op"}),
		gitErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gitfleet_agent_git_errors_total",
			Help: "Failed git operations (fetch, push)."}, []string{"op"}),
		imageBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gitfleet_agent_image_cache_bytes",
			Help: "Bytes held by the image cache after its last collection."}),
		imageRemoved: prometheus.NewCounter(prometheus.CounterOpts{Name: "gitfleet_agent_image_cache_removed_total",
			Help: "Cached artifacts removed because no VM used them for the image grace."}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gitfleet_agent_snapshot_refusals_total",
			Help: "Snapshots commits refused before any epoch fence, once per commit, by reason: signature (not signed by a key of controllerKeys) or invalid (does not parse, names another host, too large)."}, []string{"reason"}),
		writeRefused: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gitfleet_agent_status_write_refused",
			Help: "1 while the remote refuses this host's status writes (a pre-receive hook, a protected branch), labelled with what the remote said (at most 256 bytes; empty when it sent none); absent while it takes them."}, []string{"error"}),
	}
	for _, c := range []prometheus.Collector{m.passes, m.creates, m.git, m.gitErrors, m.imageBytes, m.imageRemoved, m.refusals, m.writeRefused, &reportCollector{m: m}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{CreateOK, CreateFailed} {
		m.creates.WithLabelValues(r)
	}
	for _, r := range []string{RefusedSignature, RefusedInvalid} {
		m.refusals.WithLabelValues(r)
	}
	for _, op := range []string{GitFetch, GitPush} {
		m.git.WithLabelValues(op)
		m.gitErrors.WithLabelValues(op)
	}
	return m, nil
}

func (m *Metrics) watch(e *Engine) {
	if m != nil {
		m.engine.Store(e)
	}
}

func (m *Metrics) pass(d time.Duration) {
	if m != nil {
		m.passes.Observe(d.Seconds())
	}
}

func (m *Metrics) create(ok bool) {
	if m == nil {
		return
	}
	if ok {
		m.creates.WithLabelValues(CreateOK).Inc()
	} else {
		m.creates.WithLabelValues(CreateFailed).Inc()
	}
}

func (m *Metrics) gitOp(op string, d time.Duration, err error) {
	if m == nil {
		return
	}
	m.git.WithLabelValues(op).Observe(d.Seconds())
	if err != nil {
		m.gitErrors.WithLabelValues(op).Inc()
	}
}

// refused counts one refused snapshots commit; err wraps
// ErrSnapshotInvalid.
func (m *Metrics) refused(err error) {
	if m == nil {
		return
	}
	reason := RefusedInvalid
	if errors.Is(err, ErrSnapshotSignature) {
		reason = RefusedSignature
	}
	m.refusals.WithLabelValues(reason).Inc()
}

// statusRefused sets gitfleet_agent_status_write_refused from r (nil:
// the remote takes the writes).
func (m *Metrics) statusRefused(r *writeRefusal) {
	if m == nil {
		return
	}
	m.writeRefused.Reset()
	if r != nil {
		m.writeRefused.WithLabelValues(safetext.Truncate(r.Said, maxRefusalLabel)).Set(1)
	}
}

// maxRefusalLabel bounds the error label of
// gitfleet_agent_status_write_refused, in bytes.
const maxRefusalLabel = 256

func (m *Metrics) images(res ImageCollection) {
	if m == nil {
		return
	}
	m.imageBytes.Set(float64(res.KeptBytes))
	m.imageRemoved.Add(float64(len(res.Removed)))
}

func (m *Metrics) ticked(at time.Time) {
	if m != nil {
		m.lastTick.Store(at.UnixNano())
	}
}

// LastTick is when the agent's reconcile loop last finished a tick; zero
// before the first.
func (m *Metrics) LastTick() time.Time {
	if m == nil || m.lastTick.Load() == 0 {
		return time.Time{}
	}
	return time.Unix(0, m.lastTick.Load())
}

// The phases gitfleet_agent_vms counts, every one always exported.
var reportPhases = []string{status.PhasePending, status.PhaseCreating, status.PhaseBooting, status.PhaseReady,
	status.PhaseStopping, status.PhaseStopped, status.PhaseRestarting, status.PhaseFailed}

var (
	vmsDesc         = prometheus.NewDesc("gitfleet_agent_vms", "VMs this host runs, by phase (quarantined and vanished VMs apart).", []string{"phase"}, nil)
	quarantinedDesc = prometheus.NewDesc("gitfleet_agent_vms_quarantined", "Tombstoned VMs shut down and waiting for their grace.", nil, nil)
	vanishedDesc    = prometheus.NewDesc("gitfleet_agent_vms_vanished", "VMs the snapshot dropped without a tombstone, kept.", nil, nil)
	epochDesc       = prometheus.NewDesc("gitfleet_agent_snapshot_epoch", "Epoch of the last accepted snapshot.", nil, nil)
	fenceDesc       = prometheus.NewDesc("gitfleet_agent_fence_violation", "1 while the host refuses its snapshot (fenced), else 0.", nil, nil)
	suspendedDesc   = prometheus.NewDesc("gitfleet_agent_suspended", "1 while the host's Host spec suspends it (it acts on nothing), else 0.", nil, nil)
	networkDesc     = prometheus.NewDesc("gitfleet_agent_network_degraded",
		"1 while something on the host keeps a host network's guests' traffic from flowing (a foreign firewall's drop on the forward path, a route over a nat network's CIDR, a missing bridge: the status's networks[].degraded says what), else 0, by network.", []string{"network"}, nil)
	awaitingDesc = prometheus.NewDesc("gitfleet_agent_deletes_awaiting_confirmation",
		"Quarantined objects whose tombstone grace has passed and whose delete waits for the controller to confirm it (a snapshot carrying the quarantine's nonce), by kind (vm, volume): not destroyed until it does.", []string{"kind"}, nil)
	backupSuccessDesc = prometheus.NewDesc("gitfleet_agent_backup_last_success_timestamp_seconds",
		"When the last whole backup of a VM with a backup policy started (Unix seconds; 0: none yet), by vm.", []string{"vm"}, nil)
	backupFailingDesc = prometheus.NewDesc("gitfleet_agent_backup_failing",
		"1 while the last backup attempt of a VM failed (its status says why), else 0, by vm.", []string{"vm"}, nil)
)

// reportCollector exports Engine.Report as gauges at scrape time; nothing
// before an engine is made with its Metrics.
type reportCollector struct{ m *Metrics }

func (c *reportCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{vmsDesc, quarantinedDesc, vanishedDesc, epochDesc, fenceDesc, suspendedDesc, networkDesc, awaitingDesc, backupSuccessDesc, backupFailingDesc} {
		ch <- d
	}
}

func (c *reportCollector) Collect(ch chan<- prometheus.Metric) {
	e := c.m.engine.Load()
	if e == nil {
		return
	}
	st := e.Report()
	byPhase := map[string]int{}
	for _, vm := range st.VMs {
		byPhase[vm.Phase]++
	}
	for _, ph := range reportPhases {
		ch <- prometheus.MustNewConstMetric(vmsDesc, prometheus.GaugeValue, float64(byPhase[ph]), ph)
		delete(byPhase, ph)
	}
	for ph, n := range byPhase { // a phase added later is exported too
		ch <- prometheus.MustNewConstMetric(vmsDesc, prometheus.GaugeValue, float64(n), ph)
	}
	ch <- prometheus.MustNewConstMetric(quarantinedDesc, prometheus.GaugeValue, float64(len(st.Quarantined)))
	ch <- prometheus.MustNewConstMetric(vanishedDesc, prometheus.GaugeValue, float64(len(st.Vanished)))
	ch <- prometheus.MustNewConstMetric(epochDesc, prometheus.GaugeValue, float64(st.LastSeenEpoch))
	fenced := 0.0
	if st.FenceViolation {
		fenced = 1
	}
	ch <- prometheus.MustNewConstMetric(fenceDesc, prometheus.GaugeValue, fenced)
	suspended := 0.0
	if st.Suspended != nil {
		suspended = 1
	}
	ch <- prometheus.MustNewConstMetric(suspendedDesc, prometheus.GaugeValue, suspended)
	for _, n := range st.Networks {
		degraded := 0.0
		if n.Degraded != "" {
			degraded = 1
		}
		ch <- prometheus.MustNewConstMetric(networkDesc, prometheus.GaugeValue, degraded, n.Name)
	}
	now := e.now()
	ch <- prometheus.MustNewConstMetric(awaitingDesc, prometheus.GaugeValue, float64(awaitingConfirmation(st.Quarantined, now)), confirmVM)
	ch <- prometheus.MustNewConstMetric(awaitingDesc, prometheus.GaugeValue, float64(awaitingConfirmation(st.QuarantinedVolumes, now)), confirmVolume)
	for _, vm := range st.VMs {
		b := vm.Backup
		if b == nil {
			continue
		}
		last, failing := 0.0, 0.0
		if !b.LastSuccess.IsZero() {
			last = float64(b.LastSuccess.Unix())
		}
		if b.LastError != "" {
			failing = 1
		}
		ch <- prometheus.MustNewConstMetric(backupSuccessDesc, prometheus.GaugeValue, last, vm.Name)
		ch <- prometheus.MustNewConstMetric(backupFailingDesc, prometheus.GaugeValue, failing, vm.Name)
	}
}

// awaitingConfirmation counts the quarantines whose grace has passed at
// now and that wait for the controller's confirmation.
func awaitingConfirmation(qs []status.Quarantine, now time.Time) int {
	n := 0
	for _, q := range qs {
		if q.AwaitsConfirmation() && !q.DestroyAt.IsZero() && !now.Before(q.DestroyAt) {
			n++
		}
	}
	return n
}

// Healthz answers a health check (GET /healthz): 200 "ok" while the
// reconcile loop has finished a tick within three tick intervals, 503 with
// the reason otherwise. A failing git does not make the agent unhealthy: it
// keeps reconciling the last accepted snapshot (see
// gitfleet_agent_git_errors_total); a wedged reconcile loop does, and so
// does a remote that refuses the status writes (503 with the remote's
// message, since the first refused write, until one is taken): the
// controller then sees the host as offline, and only a person can change
// the remote's rule.
func (a *Agent) Healthz(w http.ResponseWriter, _ *http.Request) {
	code, msg := a.health(a.cfg.Now())
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	fmt.Fprintln(w, msg)
}

// health is Healthz's answer at now: the reconcile loop's, then the
// status writes'.
func (a *Agent) health(now time.Time) (int, string) {
	code, msg := a.loopHealth(now)
	if r := a.refused.Load(); r != nil && code == http.StatusOK {
		return http.StatusServiceUnavailable, fmt.Sprintf("the remote refuses the status writes since %s (the controller sees this host offline): %s",
			r.Since.UTC().Format(time.RFC3339), r.Error)
	}
	return code, msg
}

// loopHealth is whether the reconcile loop ticks, at now.
func (a *Agent) loopHealth(now time.Time) (int, string) {
	limit := 3 * a.cfg.TickInterval
	last := a.cfg.Metrics.LastTick()
	switch {
	case a.cfg.Metrics == nil:
		return http.StatusOK, "ok (no metrics: the reconcile loop is not watched)"
	case last.IsZero():
		if started := a.started.Load(); started != nil && now.Sub(*started) > limit {
			return http.StatusServiceUnavailable, fmt.Sprintf("no tick finished since the start %s ago (limit %s)", now.Sub(*started).Round(time.Second), limit)
		}
		return http.StatusOK, "ok (starting)"
	case now.Sub(last) > limit:
		return http.StatusServiceUnavailable, fmt.Sprintf("the last tick finished %s ago (limit %s): the reconcile loop is stuck", now.Sub(last).Round(time.Second), limit)
	}
	return http.StatusOK, "ok"
}
