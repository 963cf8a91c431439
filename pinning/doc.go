// Package pinning owns the certificate side of an inbound RTE and of the app that dials it.
//
// On the RTE side it loads the RTE's own TLS certificate, or generates a self-signed one on the
// first start and keeps it on disk so the pin survives a restart (LoadOrCreate), and it makes
// the registration call that hands that certificate to the app (Registrar, PROTOCOL.md
// section 2). On the app side it dials an inbound RTE only when the certificate the RTE presents
// is byte for byte the one an admin approved (Dialer, PROTOCOL.md sections 1 and 3).
//
// What it refuses to do:
//   - Trust a certificate authority for an inbound RTE. The approved certificate is the whole
//     trust: a CA-signed certificate that is not the pinned one is refused like any other.
//   - Send the RTE token to a peer whose certificate was not checked first. The comparison runs
//     inside the TLS handshake, before any HTTP request is written.
//   - Repair a half-configured certificate pair by guessing. A key without its certificate (or
//     the reverse), a key that does not match, or an expired certificate stops the start with
//     a message naming the file and the fix; only a pair this package itself was writing when
//     the process died is completed.
//   - Log a token. Only its short fingerprint is logged.
//
// The short fingerprints it logs and checks are the protocol package's; see
// docs/fingerprints-and-pinning.md for what an operator compares and when.
package pinning
