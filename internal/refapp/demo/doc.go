// Package demo is `rte-app demo`: the reference app, a real RTE over TLS (a child process)
// and a real playbook on this machine, with a private sshd on loopback as a second managed
// host when Debian's openssh-server is there. It walks through what an operator does:
// registration, comparing the fingerprints the RTE logged, approval, a job followed to its end.
//
// It owns the orchestration of those processes and their clean stop (each child in its own
// process group, killed if rte-app dies), started with the tests' own launchers
// (internal/testenv's SSHD and RTE), so the demo and the tests stand them up one way; it
// refuses to decide anything the app, the API or the RTE decide, and goes through the same
// packages and the same admin API as an operator.
package demo
