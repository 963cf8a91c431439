// Command rte is the runtime environment that runs Ansible playbooks for the app. It is wiring
// only: it reads the settings, builds the logger and the packages, and serves. Everything that
// decides behaviour lives in a package that a test can drive; run is the testable entry point.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Environ(), os.Stdout, os.Stderr, signals()))
}

// signals delivers SIGTERM and SIGINT (the first drains, a second cancels at once) and SIGHUP,
// which serve logs and otherwise ignores: its default action would end the process at once.
func signals() <-chan os.Signal {
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	return ch
}
