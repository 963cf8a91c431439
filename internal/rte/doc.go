// Package rte is the assembled RTE: Run opens the spool (ending the jobs the last start left
// running), the work path, the files (a local folder or the bundle cache), the jobs Manager,
// the socket's owner and the listener, serves, and on a signal drains and stops. It owns the
// lifecycle and the decisions no single piece can make: when /ready says yes, how a drain
// gives running jobs RTE_DRAIN_SECONDS and then ends them, how long the shutdown waits, which
// of the RTE's own variables reach jobs, TLS and the proxy for calls to the app, the bridge
// between the cache and the session for bundles, the connection checker, the metrics read
// from each piece, and the preflight checks that check-config shares with the start.
//
// It refuses to parse the command line or the environment (cmd/rte and internal/config do),
// to build a logger (it is given one), and to own any protocol rule, job record or cache
// policy: those stay in server/session, jobs and cache, and Run only plugs them together. It
// never calls os.Exit and reads no signal itself: the caller passes a channel.
package rte
