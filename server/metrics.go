package server

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// registerMetrics registers the server's own collectors, and the Go runtime and process
// collectors unless the caller registered them already.
func (s *Server) registerMetrics() error {
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "rte_build_info",
		Help:        "Always 1; the labels say which RTE build runs.",
		ConstLabels: prometheus.Labels{"version": s.cfg.Version, "goversion": runtime.Version()},
	})
	build.Set(1)
	s.authFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rte_auth_failures_total",
		Help: "Requests refused 401 for a missing or wrong bearer token, by endpoint (socket, metrics) and reason (missing, wrong).",
	}, []string{"endpoint", "reason"})
	for _, e := range []string{"socket", "metrics"} {
		for _, r := range []string{authMissing, authWrong} {
			s.authFailures.WithLabelValues(e, r) // present at 0 from the start, so rate() works
		}
	}
	s.regState = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "rte_registration_state",
		Help: "1 for the current state of the inbound registration with the app (registering, pending, approved, refused, unreachable), 0 for states left.",
	}, []string{"state"})
	for _, c := range []prometheus.Collector{build, s.authFailures, s.regState} {
		if err := s.cfg.Registry.Register(c); err != nil {
			return fmt.Errorf("server: register metrics: %w (one Registry per Server)", err)
		}
	}
	for _, c := range []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		var are prometheus.AlreadyRegisteredError
		if err := s.cfg.Registry.Register(c); err != nil && !errors.As(err, &are) {
			return fmt.Errorf("server: register metrics: %w", err)
		}
	}
	return nil
}
