// Package testenv is the one shared test environment: the pieces every test that needs a real
// peer stands up, written once so the unit tests, the end-to-end tests and the demo start them
// the same way.
//
// It owns:
//
//   - Poll and Eventually, the one way to wait for a condition with a deadline (no hand-written
//     deadline loops in tests);
//   - FreePort, a loopback port that is free now;
//   - SSHD, a real OpenSSH server on loopback with its own host keys and one authorized client
//     key, for connection checks and for playbooks over ssh;
//   - ConnectProxy, an HTTP CONNECT proxy that resolves only the names it was given and keeps
//     every target it was asked for;
//   - Forwarder, a TCP forwarder that can cut every connection it carries, refuse new ones,
//     stall them (open, but no byte moves) or cut them once some bytes have passed, which
//     drops a socket without either peer closing it (StartForwarder for a test, NewForwarder
//     for the chaos harness);
//   - RTE, the built rte binary as a process with its JSON log lines captured (StartRTE for a
//     test, LaunchRTE for the demo and the chaos harness, which handle errors themselves and
//     also run rte-app serve with it), and Build, which builds the binaries once for a test
//     binary's TestMain;
//   - Tail, the end of a log for an error message, and OwnGroupTiedToParent, the attributes of
//     a child that must not outlive its parent.
//
// It refuses to be production code: no binary's serving path imports it (`rte-app demo` does,
// for its sshd and its RTE child, because the demo is a test rig that an operator runs; so
// does rte-bench, a measuring tool, for its children). It does not import
// package testing either: the helpers that fail a test take the small [T] interface, which
// *testing.T and *testing.B satisfy, so importing testenv adds no test flags to a binary. It
// holds no assertions about the RTE's behaviour: tests keep their own checks and use these
// pieces only to get real peers on real sockets. Skipping in -short mode is the caller's
// decision (testing.Short), not this package's.
package testenv
