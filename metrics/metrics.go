// Package metrics is sluice's Prometheus metrics, shared by every face (the
// decision service, the gateway and the Envoy side): store calls and their
// errors, decisions by rule and outcome, the degraded share's ledger, the
// embedded store's keys, the concurrency limit and pressure, xDS updates,
// and panics recovered at each boundary (recover.go). Everything but the
// store-call histogram is read from the engine's and the stores' own
// counters at scrape time, so a request pays nothing for it. Labels are
// rule ids, never keys.
package metrics

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/concurrency"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/global"
	"github.com/sluice-rl/sluice/overrides"
	"github.com/sluice-rl/sluice/share"
	"github.com/sluice-rl/sluice/store/memory"
	"github.com/sluice-rl/sluice/storecall"
)

// Metrics are the service's Prometheus metrics. Labels are rule ids only,
// never keys: a key could be a secret, and keys are unbounded.
type Metrics struct {
	reg       *prometheus.Registry
	latency   prometheus.Histogram
	errs      *prometheus.CounterVec
	collector *collector
	panics    panics
	changes   *prometheus.CounterVec
}

// New makes the metrics, in a registry of their own.
func New(version string) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.latency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sluice_store_call_duration_seconds",
		Help:    "Time of each call to a remote store, deadline and breaker included.",
		Buckets: []float64{.0001, .00025, .0005, .001, .002, .005, .01, .025, .05, .1},
	})
	m.errs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_store_errors_total",
		Help: "Failed store calls, by kind: deadline, breaker_open, error.",
	}, []string{"kind"})
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_build_info",
		Help: "Always 1; the labels say which sluice is running.",
	}, []string{"version", "goversion"})
	if version == "" {
		version = "(devel)"
	}
	info.WithLabelValues(version, runtime.Version()).Set(1)
	m.changes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_override_changes_total",
		Help: "Operators' overrides changed through this process, by change: created, replaced, removed.",
	}, []string{"change"})
	m.collector = &collector{panics: &m.panics}
	m.reg.MustRegister(m.latency, m.errs, m.changes, info, m.collector,
		// The scheduler's latency (go_sched_latencies_seconds: how long
		// goroutines ready to run waited for a thread) beside the default
		// Go metrics: a gateway short of CPU shows it there first.
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsScheduler)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// ObserveStoreCall records one store call; give it to
// storecall.Options.OnCall.
func (m *Metrics) ObserveStoreCall(d time.Duration, err error) {
	m.latency.Observe(d.Seconds())
	switch {
	case err == nil:
	case errors.Is(err, storecall.ErrBreakerOpen):
		m.errs.WithLabelValues("breaker_open").Inc()
	case errors.Is(err, context.DeadlineExceeded):
		m.errs.WithLabelValues("deadline").Inc()
	default:
		m.errs.WithLabelValues("error").Inc()
	}
}

// WatchConcurrency serves a concurrency limit's state: its limit, the
// requests in flight and those it shed.
func (m *Metrics) WatchConcurrency(l *concurrency.Limiter) { m.collector.conc = l }

// WatchPressure adds the pressure factor adaptive rules follow to the
// metrics.
func (m *Metrics) WatchPressure(p *concurrency.Pressure) { m.collector.pressure = p }

// OverrideChanged counts a change of an override made through this
// process: "created", "replaced" or "removed".
func (m *Metrics) OverrideChanged(change string) { m.changes.WithLabelValues(change).Inc() }

// WatchOverrides reports the operators' overrides in force.
func (m *Metrics) WatchOverrides(current func() *overrides.Set) { m.collector.overrides = current }

// WatchGlobal reports the runner of this process's global rules
// (--global-home).
func (m *Metrics) WatchGlobal(r *global.Runner) { m.collector.global = r }

// QuotaStats are the Rate Limit Quota Service's counts (rlqs.Stats), as
// the metrics read them.
type QuotaStats struct {
	Streams, Subscriptions, Pending                      int64
	Buckets                                              int
	Reports, Responses, Refused, Unpaid, Lost, Abandoned uint64
}

// WatchQuota reports the Rate Limit Quota Service's streams and grants,
// read by stats at each scrape.
func (m *Metrics) WatchQuota(stats func() QuotaStats) { m.collector.quota = stats }

// WatchRules reports a rules source's updates (an xDS subscription).
func (m *Metrics) WatchRules(src RulesSource) { m.collector.rules = src }

// RulesSource is a source of rules other than files, such as an xDS
// subscription (package envoy/xds).
type RulesSource interface {
	// Version is the version of the configuration applied last, and
	// whether one has been.
	Version() (string, bool)
	// Updates counts the configurations applied and refused.
	Updates() (applied, refused uint64)
	// Connected reports whether the source is reachable now.
	Connected() bool
}

// Registry is where the metrics are registered, for /metrics to serve.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Watch reads the engine's counters, and the embedded store's and the
// share layer's when set, at each scrape.
func (m *Metrics) Watch(e *engine.Engine, mem *memory.Store, sh *share.Store) {
	m.collector.e, m.collector.mem, m.collector.share = e, mem, sh
}

// collector reads the engine's and the store's counters at scrape time, so
// requests pay nothing for metrics.
type collector struct {
	e        *engine.Engine
	mem      *memory.Store
	share    *share.Store
	panics   *panics
	conc     *concurrency.Limiter
	pressure *concurrency.Pressure
	rules    RulesSource
	global   *global.Runner
	quota    func() QuotaStats

	overrides func() *overrides.Set
}

var (
	descKeyOverrides = prometheus.NewDesc("sluice_overrides",
		"Operators' overrides in force (not expired), by action: limit, exempt, block.", []string{"action"}, nil)
	descQuotaStreams = prometheus.NewDesc("sluice_rlqs_streams",
		"Envoys' Rate Limit Quota Service streams open.", nil, nil)
	descQuotaBuckets = prometheus.NewDesc("sluice_rlqs_buckets",
		"Quota buckets reported (distinct bucket ids); sluice_rlqs_subscriptions counts them per stream.", nil, nil)
	descQuotaSubscriptions = prometheus.NewDesc("sluice_rlqs_subscriptions",
		"Quota buckets reported per stream, summed over the streams (at most 100,000 a process).", nil, nil)
	descQuotaPending = prometheus.NewDesc("sluice_rlqs_pending",
		"Quota assignments waiting for their stream's client to read them: at most one per subscription waiting, besides a response being sent.", nil, nil)
	descQuotaReports = prometheus.NewDesc("sluice_rlqs_reports_total",
		"Usage report messages taken from Envoys.", nil, nil)
	descQuotaResponses = prometheus.NewDesc("sluice_rlqs_responses_total",
		"Responses (assignments, renewals, abandons) sent to Envoys.", nil, nil)
	descQuotaRefused = prometheus.NewDesc("sluice_rlqs_refused_total",
		"Quota streams ended for a bad report or a bound, by a status the Envoy logs.", nil, nil)
	descQuotaUnpaid = prometheus.NewDesc("sluice_rlqs_unpaid_total",
		"Quota grants the store could not pay for in full: shortened, kept as they were, or answered DENY_ALL.", nil, nil)
	descQuotaLost = prometheus.NewDesc("sluice_rlqs_store_failures_total",
		"Store calls of the quota service that failed: the grants then lapse into Envoy's own fallback at their TTL.", nil, nil)
	descQuotaAbandoned = prometheus.NewDesc("sluice_rlqs_abandoned_total",
		"Quota buckets abandoned because the server holds as many as it takes.", nil, nil)
	descGlobalExchanges = prometheus.NewDesc("sluice_global_exchanges_total",
		"Exchanges of global rules' shares this process made with the home, as its region's lead.", nil, nil)
	descGlobalFailures = prometheus.NewDesc("sluice_global_failures_total",
		"Steps of the global rules' runner that failed (pooling demand, the lead, reading or setting shares, exchanges): the shares stay as they are and leases end on their own.", nil, nil)
	descGlobalLead = prometheus.NewDesc("sluice_global_lead",
		"1 while this process leads its region's exchanges of global rules' shares.", nil, nil)
	descGlobalDropped = prometheus.NewDesc("sluice_global_demand_dropped_total",
		"Decisions of global rules not counted as demand: the bound of keys between two ticks was reached.", nil, nil)
	descPressure = prometheus.NewDesc("sluice_pressure_factor",
		"The share of their rate that rules marked adaptive admit now: 1 while the upstream is healthy, less as its answers slow down or fail (--adaptive).", nil, nil)
	descConcShedTier = prometheus.NewDesc("sluice_concurrency_shed_by_tier_total",
		"Requests answered 503 because the concurrency limit was reached, by priority tier (with a priority section in the rule file).", []string{"tier"}, nil)
	descConcLimit = prometheus.NewDesc("sluice_concurrency_limit",
		"The adaptive concurrency limit in front of the upstream (--adaptive).", nil, nil)
	descConcInFlight = prometheus.NewDesc("sluice_concurrency_in_flight",
		"Requests in flight to the upstream under the concurrency limit.", nil, nil)
	descConcShed = prometheus.NewDesc("sluice_concurrency_shed_total",
		"Requests answered 503 because the concurrency limit was reached.", nil, nil)
	descDecisions = prometheus.NewDesc("sluice_decisions_total",
		"Decisions by rule and outcome: allowed (the request passed), limited, overruled (the rule had room, another rule refused the request, nothing was charged), shadow_limited, failed_open, failed_closed, skipped (key missing), locked (penalty applied).",
		[]string{"rule", "outcome"}, nil)
	descSettles = prometheus.NewDesc("sluice_settles_total",
		"Settles of reservations by rule and outcome: settled, or unsettled (no open reservation: settled already, or past its deadline, when the estimate stood).",
		[]string{"rule", "outcome"}, nil)
	descTiers = prometheus.NewDesc("sluice_tier_decisions_total",
		"Decisions of rules with priority tiers, by rule, tier and outcome: allowed, or limited (refused, the lowest tiers first as the limit fills).",
		[]string{"rule", "tier", "outcome"}, nil)
	descNearLimit = prometheus.NewDesc("sluice_near_limit_total",
		"Allowed requests that left their key within 10% of its burst.", []string{"rule"}, nil)
	descBreaker = prometheus.NewDesc("sluice_store_breaker_state",
		"The store circuit breaker: 0 closed, 1 half-open, 2 open.", nil, nil)
	descStoreDeadline = prometheus.NewDesc("sluice_store_deadline_seconds",
		"The deadline a store call gets now: the store's adaptive deadline plus sluice_scheduling_delay_seconds.", nil, nil)
	descSchedDelay = prometheus.NewDesc("sluice_scheduling_delay_seconds",
		"What this process's own scheduling latency adds to a store call's deadline now (four times the recent 99th percentile of Go's /sched/latencies:seconds, at most 2 s): a busy gateway is given the time its goroutines wait to run.", nil, nil)
	descStoreWorkers = prometheus.NewDesc("sluice_store_call_workers",
		"Goroutines that run store calls (one per call in flight, or a call followed past its deadline), by state: busy, idle (ended after 2 s without work).", []string{"state"}, nil)
	descRulesVersion = prometheus.NewDesc("sluice_rules_version_info",
		"Always 1; the label is the version of the rules serving: sha256: and the start of the rule files' digest, or the xDS response's version_info.", []string{"version"}, nil)
	descXDSUpdates = prometheus.NewDesc("sluice_xds_updates_total",
		"Configurations received from the xDS management server, by result: applied (ACKed) or refused (NACKed; the rules serving stay).", []string{"result"}, nil)
	descXDSConnected = prometheus.NewDesc("sluice_xds_connected",
		"1 while a stream to the xDS management server is open, else 0 (the rules last applied keep serving).", nil, nil)
	descReloads = prometheus.NewDesc("sluice_config_reloads_total",
		"Rule file reloads by result: ok, refused.", []string{"result"}, nil)
	descKeys = prometheus.NewDesc("sluice_memory_store_keys",
		"Keys held by the embedded store, by rule (dead keys not yet reused included).", []string{"rule"}, nil)
	descEvictions = prometheus.NewDesc("sluice_memory_store_evictions_total",
		"Live keys the embedded store evicted to stay within its bound, by rule.", []string{"rule"}, nil)
	descHolds = prometheus.NewDesc("sluice_memory_store_reservations",
		"Reservations the embedded store keeps open (some may be past their deadline, not yet dropped).", nil, nil)
	descHoldsDropped = prometheus.NewDesc("sluice_memory_store_reservations_refused_total",
		"Requests the embedded store refused (503) because it held its bound of open reservations.", nil, nil)
	descOverflows = prometheus.NewDesc("sluice_memory_store_overflows_total",
		"Takes of new keys the embedded store answered from a rule's shared, strict overflow state, because the key bound was full of limited keys, by rule.", []string{"rule"}, nil)
	descDegraded = prometheus.NewDesc("sluice_degraded_decisions_total",
		"Decisions made while the store failed, by rule: fail-open rules within their per-gateway share, fail-closed rules refusing (failed_open + failed_closed).", []string{"rule"}, nil)
	descOwed = prometheus.NewDesc("sluice_degraded_owed_units",
		"Units this gateway admitted on its own while the store did not answer, not yet charged to the store.", nil, nil)
	descWrittenBack = prometheus.NewDesc("sluice_degraded_written_back_units_total",
		"Units admitted while the store did not answer, charged to it once it answered.", nil, nil)
	descUnwritten = prometheus.NewDesc("sluice_degraded_unwritten_units_total",
		"Units admitted while the store did not answer and never charged to it: their limit's period passed first (expired) or the ledger of owed keys was full (overflow).", []string{"reason"}, nil)
	descLateReplies = prometheus.NewDesc("sluice_store_late_replies_total",
		"Store calls that missed their deadline (answered from the gateway's share) and were followed for 5 s more: answered (what the store counted was credited, so nothing is counted twice), lost (no reply, or an error: what they carried stays owed) or unsent (still queued when their caller stopped waiting: they applied nothing).", []string{"outcome"}, nil)
	descCredit = prometheus.NewDesc("sluice_degraded_credit_units",
		"Units the store counted in late-answered calls that this gateway did not admit, not yet given back to it.", nil, nil)
	descRefunded = prometheus.NewDesc("sluice_degraded_refunded_units_total",
		"Units given back to the store: counted by a late-answered call, not admitted by this gateway.", nil, nil)
	descGateways = prometheus.NewDesc("sluice_gateways",
		"Gateways sharing the store, as this one counts them (live heartbeats, or --gateways).", nil, nil)
	descDescriptorLimits = prometheus.NewDesc("sluice_descriptor_limits",
		"Distinct descriptor limits (the limit an Envoy descriptor carries) counted now.", nil, nil)
	descDescriptorLimitsRefused = prometheus.NewDesc("sluice_descriptor_limits_refused_total",
		"Envoy descriptors whose own limit was not counted because the bound on distinct descriptor limits was reached (answered by the configured rule).", nil, nil)
	// The same two under their former names, for dashboards written
	// against them: deprecated.
	descOverrides = prometheus.NewDesc("sluice_envoy_overrides",
		"Deprecated: sluice_descriptor_limits.", nil, nil)
	descOverridesRefused = prometheus.NewDesc("sluice_envoy_overrides_refused_total",
		"Deprecated: sluice_descriptor_limits_refused_total.", nil, nil)
	descStoreCalls = prometheus.NewDesc("sluice_store_calls_total",
		"Calls made to the shared store (the embedded store, or Redis), whatever the sync modes: decisions / calls is what leases and the deny cache save.", nil, nil)
	descDenyHits = prometheus.NewDesc("sluice_deny_cache_hits_total",
		"Takes refused from the deny cache without a store call.", nil, nil)
	descLeased = prometheus.NewDesc("sluice_leased_units",
		"Units held on leases by this gateway now: the bound on what leases under-admit.", nil, nil)
	descHot = prometheus.NewDesc("sluice_hot_keys",
		"Keys above 50 decisions per second on this gateway, by rule.", []string{"rule"}, nil)
	descPanics = prometheus.NewDesc("sluice_panics_total",
		"Panics recovered while serving a request (answered 500 or gRPC Internal), by boundary: http, grpc. Any is a bug: please report it.", []string{"boundary"}, nil)
)

// envoyStat is the descriptor of one of the reference service's stats.
func envoyStat(name string) *prometheus.Desc {
	return envoyStatDescs[name]
}

var envoyStatDescs = func() map[string]*prometheus.Desc {
	m := map[string]*prometheus.Desc{}
	for _, n := range []string{"total_hits", "over_limit", "within_limit", "near_limit", "shadow_mode"} {
		m[n] = prometheus.NewDesc("ratelimit_service_rate_limit_"+n,
			"envoyproxy/ratelimit's "+n+" stat, by descriptor stats key (Envoy-format rules).", []string{"key"}, nil)
	}
	return m
}()

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range envoyStatDescs {
		ch <- d
	}
	for _, d := range []*prometheus.Desc{descDecisions, descSettles, descTiers, descNearLimit, descBreaker, descStoreDeadline, descSchedDelay, descStoreWorkers, descReloads, descRulesVersion, descXDSUpdates, descXDSConnected, descKeys, descEvictions, descHolds, descHoldsDropped, descOverflows, descDegraded, descOwed, descWrittenBack, descUnwritten, descLateReplies, descCredit, descRefunded, descGateways, descDescriptorLimits, descDescriptorLimitsRefused, descOverrides, descOverridesRefused, descKeyOverrides, descStoreCalls, descDenyHits, descLeased, descHot, descPanics, descConcLimit, descConcInFlight, descConcShed, descConcShedTier, descPressure, descGlobalExchanges, descGlobalFailures, descGlobalLead, descGlobalDropped,
		descQuotaStreams, descQuotaBuckets, descQuotaSubscriptions, descQuotaPending, descQuotaReports, descQuotaResponses, descQuotaRefused, descQuotaUnpaid, descQuotaLost, descQuotaAbandoned} {
		ch <- d
	}
}

// Collect sends every metric: one linear sequence of reads of the
// engine's, the store's and the planes' counters, each a few lines, read
// whole (the rules' own in collectRules).
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(descPanics, c.panics.http.Load(), "http")
	counter(descPanics, c.panics.grpc.Load(), "grpc")
	if c.overrides != nil {
		n := map[overrides.Action]int{overrides.Limit: 0, overrides.Exempt: 0, overrides.Block: 0}
		for _, o := range c.overrides().Live(time.Now()) {
			n[o.Action]++
		}
		for a, v := range n {
			ch <- prometheus.MustNewConstMetric(descKeyOverrides, prometheus.GaugeValue, float64(v), string(a))
		}
	}
	if l := c.conc; l != nil {
		ch <- prometheus.MustNewConstMetric(descConcLimit, prometheus.GaugeValue, float64(l.Limit()))
		ch <- prometheus.MustNewConstMetric(descConcInFlight, prometheus.GaugeValue, float64(l.InFlight()))
		counter(descConcShed, l.Shed())
		if c.e != nil {
			if p := c.e.Config().Priority; p != nil {
				for i, name := range p.Levels {
					counter(descConcShedTier, l.ShedAt(i), name)
				}
			}
		}
	}
	if g := c.global; g != nil {
		st := g.Stats()
		counter(descGlobalExchanges, st.Exchanges)
		counter(descGlobalFailures, st.Failures)
		counter(descGlobalDropped, st.Dropped)
		lead := 0.0
		if st.Leads {
			lead = 1
		}
		ch <- prometheus.MustNewConstMetric(descGlobalLead, prometheus.GaugeValue, lead)
	}
	if q := c.quota; q != nil {
		st := q()
		for d, v := range map[*prometheus.Desc]float64{descQuotaStreams: float64(st.Streams), descQuotaBuckets: float64(st.Buckets),
			descQuotaSubscriptions: float64(st.Subscriptions), descQuotaPending: float64(st.Pending)} {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
		}
		counter(descQuotaReports, st.Reports)
		counter(descQuotaResponses, st.Responses)
		counter(descQuotaRefused, st.Refused)
		counter(descQuotaUnpaid, st.Unpaid)
		counter(descQuotaLost, st.Lost)
		counter(descQuotaAbandoned, st.Abandoned)
	}
	if p := c.pressure; p != nil {
		ch <- prometheus.MustNewConstMetric(descPressure, prometheus.GaugeValue, p.Factor())
	}
	if c.e == nil {
		return
	}
	c.collectRules(counter)
	ch <- prometheus.MustNewConstMetric(descGateways, prometheus.GaugeValue, float64(c.e.Gateways()))
	owed := c.e.Store().Owed()
	ch <- prometheus.MustNewConstMetric(descOwed, prometheus.GaugeValue, float64(owed.Owed))
	counter(descWrittenBack, uint64(owed.Written))
	counter(descUnwritten, uint64(owed.Expired), "expired")
	counter(descUnwritten, uint64(owed.Overflow), "overflow")
	counter(descUnwritten, uint64(owed.Shutdown), "shutdown")
	if c.e.Store().Guarded() {
		counter(descLateReplies, uint64(owed.LateAnswered), "answered")
		counter(descLateReplies, uint64(owed.LateLost), "lost")
		counter(descLateReplies, uint64(owed.LateUnsent), "unsent")
		ch <- prometheus.MustNewConstMetric(descCredit, prometheus.GaugeValue, float64(owed.Credit))
		counter(descRefunded, uint64(owed.Refunded))
	}
	state := map[string]float64{"closed": 0, "half-open": 1, "open": 2}[c.e.Store().BreakerState()]
	ch <- prometheus.MustNewConstMetric(descBreaker, prometheus.GaugeValue, state)
	if c.e.Store().Guarded() {
		deadline, sched := c.e.Store().Deadline()
		ch <- prometheus.MustNewConstMetric(descStoreDeadline, prometheus.GaugeValue, deadline.Seconds())
		ch <- prometheus.MustNewConstMetric(descSchedDelay, prometheus.GaugeValue, sched.Seconds())
		running, idle := c.e.Store().Workers()
		ch <- prometheus.MustNewConstMetric(descStoreWorkers, prometheus.GaugeValue, float64(running-idle), "busy")
		ch <- prometheus.MustNewConstMetric(descStoreWorkers, prometheus.GaugeValue, float64(idle), "idle")
	}
	if c.share != nil {
		st := c.share.Stats()
		counter(descStoreCalls, st.RemoteCalls)
		counter(descDenyHits, st.DenyHits)
		ch <- prometheus.MustNewConstMetric(descLeased, prometheus.GaugeValue, float64(st.LeasedOut))
		hot := map[string]int{}
		for _, h := range c.share.Hot.Top(1000, sluice.DefaultHotAbove, time.Now().UnixNano()) {
			hot[h.Rule]++
		}
		for rule, n := range hot {
			ch <- prometheus.MustNewConstMetric(descHot, prometheus.GaugeValue, float64(n), rule)
		}
	}
	live, refusedLimits := c.e.DescriptorLimitStats()
	ch <- prometheus.MustNewConstMetric(descDescriptorLimits, prometheus.GaugeValue, float64(live))
	counter(descDescriptorLimitsRefused, refusedLimits)
	ch <- prometheus.MustNewConstMetric(descOverrides, prometheus.GaugeValue, float64(live))
	counter(descOverridesRefused, refusedLimits)
	ok, refused := c.e.Reloads()
	counter(descReloads, ok, "ok")
	counter(descReloads, refused, "refused")
	ch <- prometheus.MustNewConstMetric(descRulesVersion, prometheus.GaugeValue, 1, c.e.Config().Version)
	if c.rules != nil {
		applied, refused := c.rules.Updates()
		counter(descXDSUpdates, applied, "applied")
		counter(descXDSUpdates, refused, "refused")
		up := 0.0
		if c.rules.Connected() {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(descXDSConnected, prometheus.GaugeValue, up)
	}
	if c.mem == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(descHolds, prometheus.GaugeValue, float64(c.mem.OpenHolds()))
	counter(descHoldsDropped, c.mem.RefusedHolds())
	keys, evictions, overflows := map[string]int{}, map[string]uint64{}, map[string]uint64{}
	for _, st := range c.mem.Stats() {
		keys[st.Rule] += st.Keys
		evictions[st.Rule] += st.Evictions
		overflows[st.Rule] += st.Overflows
	}
	for rule, n := range keys {
		ch <- prometheus.MustNewConstMetric(descKeys, prometheus.GaugeValue, float64(n), rule)
		counter(descEvictions, evictions[rule], rule)
		counter(descOverflows, overflows[rule], rule)
	}
}

// collectRules sends each rule's counts: every rule that has decided a
// request, and for Envoy descriptor rules the reference service's stats.
func (c *collector) collectRules(counter func(d *prometheus.Desc, v uint64, labels ...string)) {
	// A rule that has decided nothing has no series: a rule set of 50,000
	// descriptors (an xDS snapshot) would otherwise make every scrape
	// hundreds of thousands of zeros, 28 MB and seconds to render.
	stats := slices.DeleteFunc(c.e.Stats(), engine.RuleStats.Idle)
	for _, s := range stats {
		counter(descDecisions, s.Allowed, s.Rule, "allowed")
		counter(descDecisions, s.Limited, s.Rule, "limited")
		counter(descDecisions, s.Overruled, s.Rule, "overruled")
		counter(descDecisions, s.ShadowLimited, s.Rule, "shadow_limited")
		counter(descDecisions, s.FailedOpen, s.Rule, "failed_open")
		counter(descDecisions, s.FailedClosed, s.Rule, "failed_closed")
		counter(descDecisions, s.Skipped, s.Rule, "skipped")
		counter(descDecisions, s.Locked, s.Rule, "locked")
		counter(descNearLimit, s.NearLimit, s.Rule)
		for _, t := range s.Tiers {
			counter(descTiers, t.Allowed, s.Rule, t.Tier, "allowed")
			counter(descTiers, t.Limited, s.Rule, t.Tier, "limited")
		}
		if s.Settled+s.Unsettled > 0 {
			counter(descSettles, s.Settled, s.Rule, "settled")
			counter(descSettles, s.Unsettled, s.Rule, "unsettled")
		}
		counter(descDegraded, s.FailedOpen+s.FailedClosed, s.Rule)
	}
	// The reference service's per-descriptor stats, under its Prometheus
	// names, labelled by its stats key (domain.key_value...): one series per
	// configured descriptor, so the labels stay bounded.
	cfg := c.e.Config()
	for _, st := range stats {
		r := cfg.Rule(st.Rule)
		if r == nil || r.Envoy == nil || r.Envoy.StatsKey == "" {
			continue
		}
		// As the reference counts them: a descriptor within its limit is
		// within_limit even when another one put the request over.
		total := st.Allowed + st.Overruled + st.Limited + st.FailedOpen + st.FailedClosed
		for name, v := range map[string]uint64{
			"total_hits": total, "over_limit": st.Limited + st.FailedClosed, "within_limit": st.Allowed + st.Overruled + st.FailedOpen,
			"near_limit": st.NearLimit, "shadow_mode": st.ShadowLimited,
		} {
			counter(envoyStat(name), v, r.Envoy.StatsKey)
		}
	}
}
