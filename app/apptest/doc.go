// Package apptest is a fake RTE for the tests of an app built on package app, as Tailscale's
// testcontrol is a fake control server for its daemon: a real TLS listener and a real
// WebSocket speaking the real wire protocol (package protocol), so the app under test runs
// exactly the code it runs against a real RTE.
//
// It owns the RTE's side of one inbound socket as the app sees it: the bearer token and
// X-App-Node checks before the upgrade, the hello (what it runs and what it has spooled), the
// welcome and the resend of every record the welcome does not acknowledge, job.start (accept,
// accept again without starting twice, or refuse with a code), sealed secrets opened with the
// token, the acks, and records the test emits as the RTE's spool would. It notes every
// protocol violation it sees (an ack beyond what was sent, a secret that does not open) for
// the test to fail on. In raw mode it speaks no protocol at all: it sends the hello bytes it
// was given and hands every frame to the test, for tests of what the app refuses.
//
// It refuses to run playbooks, keep a spool on disk, dial the app (outbound mode), or stand
// in for the RTE in production. It imports only package protocol, the standard library and
// gorilla/websocket, so an app in another repository can use it.
package apptest
