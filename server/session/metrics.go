package session

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rte-project/rte/protocol"
)

type metrics struct {
	connected   prometheus.Gauge
	connections *prometheus.CounterVec
	replaced    prometheus.Counter
	bad         *prometheus.CounterVec
	recordsSent prometheus.Counter
	acks        prometheus.Counter
	bundles     *prometheus.CounterVec
	bundleBytes prometheus.Counter
	// bundleReused counts bytes copied from frames already in the cache instead of received.
	bundleReused prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		connected: register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rte_socket_connected",
			Help: "1 while the RTE has an open socket to the app, else 0.",
		})),
		connections: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rte_socket_connections_total",
			Help: "Sockets a session started on, by direction (inbound: the app dialled; outbound: the RTE dialled).",
		}, []string{"direction"})),
		replaced: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rte_socket_replaced_total",
			Help: "Sockets closed with 4001 because a newer socket took their place.",
		})),
		bad: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rte_bad_messages_total",
			Help: "Messages from the app answered with an error message, by error code.",
		}, []string{"code"})),
		recordsSent: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rte_records_sent_total",
			Help: "Job records written to the socket, resends after a reconnect included.",
		})),
		acks: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rte_acks_total",
			Help: "Acks applied to the spool: ack messages and the entries of welcome.acked.",
		})),
		bundles: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rte_bundles_received_total",
			Help: "Bundle transfers that ended, by result: ok (named in the cache), discarded (size, hash or a chunk did not match), missing (the app had none to send).",
		}, []string{"result"})),
		bundleBytes: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rte_bundle_received_bytes_total",
			Help: "Bytes of bundle chunks written to the cache's temporary files, resent chunks after a reconnect included.",
		})),
		bundleReused: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rte_bundle_reused_bytes_total",
			Help: "Bytes of bundles being received that were copied from frames of bundles already in the cache instead of sent by the app (protocol feature bundle.frames).",
		})),
	}
	for _, r := range []string{bundleOK, bundleDiscarded, bundleMissing} {
		m.bundles.WithLabelValues(r)
	}
	for _, d := range []string{dirInbound, dirOutbound} {
		m.connections.WithLabelValues(d) // present at 0 from the start, so rate() works
	}
	// Every code the RTE answers with, so increase() > 0 sees the first bad message too.
	for _, c := range []string{protocol.ErrBadJSON, protocol.ErrUnknownType, protocol.ErrMissingField,
		protocol.ErrBadField, protocol.ErrInvalid, protocol.ErrTooLarge, protocol.ErrUnexpected} {
		m.bad.WithLabelValues(c)
	}
	return m
}

// register registers c, or returns the collector registered before under the same name, so
// that a Manager rebuilt on the same registry (a restart inside one process) keeps counting.
// Any other failure is a programming error in the descriptors above.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic("session: register metrics: " + err.Error())
	}
	return c
}
