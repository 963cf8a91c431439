package rte

import (
	"crypto/x509"
	"encoding/json"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/rte-project/rte/cache"
	"github.com/rte-project/rte/jobs"
	"github.com/rte-project/rte/jobs/spool"
	"github.com/rte-project/rte/protocol"
	"github.com/rte-project/rte/server/session"
)

// The metrics an operator watches beside the listener's and the session's: jobs, the spool,
// the cache, the socket and the certificate (docs/probes-and-metrics.md lists them all). They
// are read from the packages that own the state at each scrape, or counted where every job's
// records pass, the recorder, so no package keeps a second copy of its own numbers.

// endStatuses are every status a job ends with, each present at 0 from the start.
var endStatuses = []string{protocol.StatusSuccess, protocol.StatusFailed, protocol.StatusCanceled,
	protocol.StatusTimeout, protocol.StatusAbandoned, protocol.StatusError}

// jobMetrics counts the ends of jobs and times them from their start record.
type jobMetrics struct {
	ended    *prometheus.CounterVec
	duration *prometheus.HistogramVec

	mu      sync.Mutex
	started map[string]time.Time
}

func newJobMetrics(reg prometheus.Registerer, running func() int) *jobMetrics {
	m := &jobMetrics{
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rte_jobs_ended_total",
			Help: "Jobs that ended, by status (success, failed, canceled, timeout, abandoned, error).",
		}, []string{"status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rte_job_duration_seconds",
			Help: "From a job's start record to its end record, by end status; jobs that ended abandoned at a restart are not timed.",
			// Playbooks run from seconds to hours.
			Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400},
		}, []string{"status"}),
		started: map[string]time.Time{},
	}
	for _, st := range endStatuses {
		m.ended.WithLabelValues(st)
		m.duration.WithLabelValues(st)
	}
	reg.MustRegister(m.ended, m.duration, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "rte_jobs_running",
		Help: "Jobs whose ansible-playbook runs now.",
	}, func() float64 { return float64(running()) }))
	return m
}

// record notes a job's start and end records as the recorder passes them on.
func (m *jobMetrics) record(job, kind string, data json.RawMessage) {
	switch kind {
	case protocol.KindStart:
		m.mu.Lock()
		m.started[job] = time.Now()
		m.mu.Unlock()
	case protocol.KindEnd:
		var end protocol.EndData
		_ = json.Unmarshal(data, &end) // the jobs package wrote it; a bad one counts as ""
		m.mu.Lock()
		start, ok := m.started[job]
		delete(m.started, job)
		m.mu.Unlock()
		m.ended.WithLabelValues(end.Status).Inc()
		if ok {
			m.duration.WithLabelValues(end.Status).Observe(time.Since(start).Seconds())
		}
	}
}

// spoolCollector reads the spool's waiting records at each scrape, and the free space of its
// filesystem.
type spoolCollector struct {
	sp                                *spool.Spool
	dir                               string
	records, bytes, oldest, freeBytes *prometheus.Desc
}

func newSpoolCollector(sp *spool.Spool, dir string) *spoolCollector {
	return &spoolCollector{
		sp: sp, dir: dir,
		records: prometheus.NewDesc("rte_spool_records_waiting",
			"Durable job records the app has not acknowledged yet.", nil, nil),
		bytes: prometheus.NewDesc("rte_spool_waiting_bytes",
			"Bytes of those records in the spool's files.", nil, nil),
		oldest: prometheus.NewDesc("rte_spool_oldest_waiting_age_seconds",
			"Age of the oldest record the app has not acknowledged; 0 when none waits.", nil, nil),
		freeBytes: prometheus.NewDesc("rte_spool_filesystem_free_bytes",
			"Bytes the RTE's user may still write on the spool's filesystem.", nil, nil),
	}
}

func (c *spoolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.records
	ch <- c.bytes
	ch <- c.oldest
	ch <- c.freeBytes
}

func (c *spoolCollector) Collect(ch chan<- prometheus.Metric) {
	var records, bytes int64
	var oldest time.Time
	for _, j := range c.sp.Jobs() {
		records += j.LastSeq - j.Acked
		bytes += j.WaitingBytes
		if !j.OldestWaiting.IsZero() && (oldest.IsZero() || j.OldestWaiting.Before(oldest)) {
			oldest = j.OldestWaiting
		}
	}
	age := 0.0
	if !oldest.IsZero() {
		age = max(0, time.Since(oldest).Seconds())
	}
	ch <- prometheus.MustNewConstMetric(c.records, prometheus.GaugeValue, float64(records))
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(bytes))
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, age)
	var st unix.Statfs_t
	if err := unix.Statfs(c.dir, &st); err == nil {
		ch <- prometheus.MustNewConstMetric(c.freeBytes, prometheus.GaugeValue, float64(st.Bavail)*float64(st.Bsize))
	} else {
		ch <- prometheus.NewInvalidMetric(c.freeBytes, err)
	}
}

// cacheCollector reads the bundle cache's numbers at each scrape (transfer mode).
type cacheCollector struct {
	c                                      *cache.Cache
	size, bundles, hits, misses, evictions *prometheus.Desc
}

func newCacheCollector(c *cache.Cache) *cacheCollector {
	return &cacheCollector{
		c:         c,
		size:      prometheus.NewDesc("rte_cache_bytes", "Bytes of bundles in the cache folder (shared by every RTE using it).", nil, nil),
		bundles:   prometheus.NewDesc("rte_cache_bundles", "Bundles in the cache folder.", nil, nil),
		hits:      prometheus.NewDesc("rte_cache_hits_total", "Bundles a job needed that were in the cache.", nil, nil),
		misses:    prometheus.NewDesc("rte_cache_misses_total", "Bundles a job needed that were fetched from the app.", nil, nil),
		evictions: prometheus.NewDesc("rte_cache_evictions_total", "Bundles this RTE removed to keep the cache within RTE_CACHE_MB.", nil, nil),
	}
}

func (c *cacheCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.size, c.bundles, c.hits, c.misses, c.evictions} {
		ch <- d
	}
}

func (c *cacheCollector) Collect(ch chan<- prometheus.Metric) {
	st, err := c.c.Stats()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.size, err)
	} else {
		ch <- prometheus.MustNewConstMetric(c.size, prometheus.GaugeValue, float64(st.Bytes))
		ch <- prometheus.MustNewConstMetric(c.bundles, prometheus.GaugeValue, float64(st.Bundles))
	}
	ch <- prometheus.MustNewConstMetric(c.hits, prometheus.CounterValue, float64(st.Hits))
	ch <- prometheus.MustNewConstMetric(c.misses, prometheus.CounterValue, float64(st.Misses))
	ch <- prometheus.MustNewConstMetric(c.evictions, prometheus.CounterValue, float64(st.Evictions))
}

// Socket states of rte_socket_state.
const (
	socketNone     = "none"     // no socket to the app
	socketOpen     = "open"     // open, the app has not answered the hello yet
	socketWelcomed = "welcomed" // open and welcomed: jobs and records flow
)

// registerSocketState adds rte_socket_state: 1 for the current state, 0 for the others.
func registerSocketState(reg prometheus.Registerer, sessions *session.Manager) {
	state := func() string {
		if !sessions.Connected() {
			return socketNone
		}
		if _, ok := sessions.Welcomed(); !ok {
			return socketOpen
		}
		return socketWelcomed
	}
	for _, s := range []string{socketNone, socketOpen, socketWelcomed} {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "rte_socket_state",
			Help:        "1 for the state the socket to the app is in (none, open, welcomed), 0 for the others.",
			ConstLabels: prometheus.Labels{"state": s},
		}, func() float64 {
			if state() == s {
				return 1
			}
			return 0
		}))
	}
}

// registerCertificateExpiry adds the listener certificate's end of validity (HTTPS=1).
func registerCertificateExpiry(reg prometheus.Registerer, leaf *x509.Certificate) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "rte_listener_certificate_expiry_timestamp_seconds",
		Help: "When the listener's certificate stops being valid (its NotAfter), in seconds since the Unix epoch.",
	})
	g.Set(float64(leaf.NotAfter.Unix()))
	reg.MustRegister(g)
}

// recorder gives the jobs package the spool's two-step append, and shows the metrics each
// job's start and end.
type recorder struct {
	*spool.Spool
	met *jobMetrics
}

func (r recorder) Append(job, kind string, data json.RawMessage) (protocol.Record, error) {
	rec, err := r.Spool.Append(job, kind, data)
	if err == nil {
		r.met.record(job, kind, data)
	}
	return rec, err
}

func (r recorder) AppendAsync(job, kind string, data json.RawMessage) (jobs.Commit, error) {
	c, err := r.Spool.AppendAsync(job, kind, data)
	if err != nil {
		return nil, err
	}
	r.met.record(job, kind, data)
	return c, nil
}
