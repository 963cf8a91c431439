// Package e2e holds the tests that matter most: the real rte binary, built from cmd/rte, on a
// real socket with the real app half, with real TLS, real ansible-playbook and real processes
// that the tests kill. It has no non-test code beyond this comment.
package e2e
