// Package chaos is the chaos harness: it runs the real reference app as two `rte-app serve`
// processes on one SQLite file and several real `rte` processes in inbound mode over TLS, each
// behind a cuttable forwarder, keeps jobs running through them (real ansible-playbook on
// localhost, files moved over the socket), and throws faults at them at moments drawn from a
// seeded source: RTEs killed, drained and hung up on, the app node holding a socket killed,
// sockets cut and stalled, the spool's file system filled, bundle transfers cut half-way.
// Afterwards it reads the app's committed store and checks that nothing a job produced was
// lost or stored twice, that every job ended, and that every end is one the faults explain.
//
// It owns the fault schedule (one seed replays the same schedule), the definition of
// recovery (the runner is connected again, after a new handshake when the fault broke the
// socket, and every record its spool held when the fault ended is stored), and the
// invariants with the table that reports them (docs/reliability.md).
//
// It refuses to judge by anything but the store and the processes it started: it never
// imports the RTE's packages or the app's internals, never weakens an invariant to let a run
// pass, and never runs a fault it cannot inject for real (spool-full needs root to mount a
// tmpfs; without it the kind is skipped and the report says so). It is a test rig, not
// production code: cmd/rte-chaos and internal/chaos/chaos_test.go run it.
package chaos
