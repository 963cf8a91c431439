// Package bench is the one benchmark command's engine (cmd/rte-bench, `task benchmark`): it
// measures the RTE path against its peers and against the machine's own limits in the same
// run, and renders one table for docs/benchmarks.md.
//
// It owns:
//
//   - the peers section: the same two playbooks (task-heavy, output-heavy) run by plain
//     ansible-playbook, by ansible-runner's transmit | worker | process pipeline, and through
//     the RTE path (`rte-app serve` with SQLite, one inbound rte process over TLS, the job
//     submitted and followed by `rte-app run`), alternating the order in each round; wall time,
//     CPU of the whole process tree, peak RSS and bytes written per run;
//   - the record path, events and scale sections, which replace ansible by a stand-in script so
//     that they measure the RTE and the app, each beside its limit: the disk's own write+fsync
//     rate and the spool alone, in the same directory, between the rounds;
//   - the files section: what an RTE fetches with bundle.frames after one file of a generated
//     2,000-file tree changed, computed from the real packer's two bundles by the RTE's rule;
//   - reading /proc (CPU, peak RSS, write_bytes) for the long-running processes, and wait4's
//     rusage for the ones it waits for;
//   - the table, and replacing the block between the rte-bench markers in docs/benchmarks.md.
//
// It refuses to fake a figure: every section checks what it measured (the bytes or events
// the store holds against those produced, every job running, every socket connected) and a
// section that cannot fails the run rather than leaving a hole in the table. It asserts no
// time and judges no aim beyond printing whether it was reached. It is a measuring tool, not
// production code: it starts real processes on loopback and removes its work directory.
package bench
