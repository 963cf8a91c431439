// Package server owns the RTE's HTTP side: the listener it is given (plain, or wrapped in TLS
// by the caller), the WebSocket endpoint /rte/v1/socket with its bearer-token check and
// upgrade, the probes /live and /ready, and /metrics behind METRICS_TOKEN. The exact
// semantics of each endpoint are in docs/probes-and-metrics.md.
//
// What it refuses to do:
//   - Upgrade a request before checking its token. A missing or wrong RTE_TOKEN is answered 401
//     with nothing of the socket machinery touched; the comparison takes the same time for
//     every wrong token.
//   - Upgrade a dialer that does not ask for the rte.v1 subprotocol: such a peer speaks
//     something else, and a clear 400 beats a socket that fails later.
//   - Log a presented token, or any part of it.
//   - Own the sockets it upgrades. Each one goes to the Acceptor at once (the session manager),
//     which alone decides its life; Serve's graceful shutdown does not wait for them.
//   - Serve /metrics without METRICS_TOKEN. Unset, the path does not exist (404), so a scrape
//     cannot learn job counts or the version of an RTE that did not opt in.
package server
