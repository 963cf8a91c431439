// Package check answers the app's connection checks (PROTOCOL.md section 9): can the RTE reach
// these managed hosts the way ansible will, right now?
//
// A Checker tries every target of one check once, at most Config.Concurrency at a time, and
// returns one outcome per target, in the targets' order, within the check's timeout. It does not
// retry and does not wait for a host to come up: the app does the waiting, in its own loop, by
// sending check again.
//
// SSH targets get a real TCP connection, SSH handshake and public-key authentication with the
// private keys and known_hosts file of the user the RTE runs as, the files ansible uses too; the
// connection is closed as soon as authentication has succeeded, without running anything. The
// keys and known_hosts are read again for every check, so an operator who adds a key or a host
// needs no restart. WinRM targets get one unauthenticated WS-Management Identify request.
//
// It refuses to: accept a host key that known_hosts does not list (there is no "trust on first
// use": the outcome says which key the host presented, and the operator adds it after verifying
// it), write to known_hosts or any other file, use a key that needs a passphrase, skip TLS
// certificate verification, or put key material or peer text longer than a sentence into an
// outcome's message. It knows nothing about sockets to the app and does not count checks against
// the RTE's job limit.
package check
