// Package session owns the life of the RTE's one socket to the app, whoever dialled it
// (PROTOCOL.md sections 4, 5, 7, 8 and 9): the hello/welcome handshake, the approval state, the
// resend of every unacknowledged spooled record after each (re)connect, the stream of new
// records as the spool grows, acks back into the spool, job.start/cancel and settings handed to
// the jobs side, capacity reports, and connection checks handed to a Checker off the reader
// goroutine (at most Config.MaxChecks at once per socket; checks.go). The inbound server (Manager.Accept) and the outbound
// Dialer (through Manager.Serve) hand their sockets to the same Manager.
//
// In outbound mode the Dialer keeps the socket: it dials APP_URL's outbound socket path with
// the runner's token, name and join token, through HTTPS_PROXY, redials with jittered backoff,
// and waits long after the app refused or rejected the runner, logging a run of failures once
// rather than once per attempt.
//
// In transfer mode (Config.Bundles) Manager.Fetch gets the bundles a job needs (section 6):
// one bundle.want per bundle and socket, however many jobs wait for it, asked again from the
// first byte on every new socket; chunks are written into the BundleStore as they arrive and
// committed at bundle.end, where the store checks size and hash. A chunk or bundle.end for a
// bundle not asked for on this socket is a bad message.
//
// The RTE holds one socket at a time. A newer socket replaces the older one, which is closed
// with 4001 "replaced"; the newer one starts again from what the app acknowledged, so a dropped
// or replaced socket loses nothing, and the app drops duplicates by (job, seq).
//
// What it refuses to do:
//   - Write to a socket except through its socket.Conn: one writer per WebSocket.
//   - Treat a bad message as fatal. It is answered with an error message and counted; only the
//     socket package's budget (100 a minute) closes the socket, with 1008.
//   - Start a job before the app's welcome, or while the app has not approved this runner.
//   - Keep records in memory. It reads them from the Outbox (the spool) when it sends them and
//     forgets them once they are written; the spool alone decides what is still unacked.
//   - Listen. The inbound listener is package server's; the Manager only serves sockets
//     handed to it, and only the Dialer dials.
package session
