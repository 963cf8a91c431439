// Command rte is the runtime environment that runs Ansible playbooks for the app. It is wiring
// only: it parses the command and the settings, builds the logger, and calls rte.Run, where
// everything that decides behaviour lives.
package main

import (
	"context"
	"embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/internal/logging"
	"github.com/rte-project/rte/internal/rte"
	"github.com/rte-project/rte/protocol"
)

// version may be set at build time with -ldflags "-X main.version=1.2.3"; rte.BuildVersion
// says what stands in for it otherwise.
var version = ""

// texts are what the binary prints for help: rte.txt, the list of commands, and
// <command>.txt, each command's --help answer.
//
//go:embed help
var texts embed.FS

// maxArgs are the commands and how many arguments each takes; aliases are other spellings.
var (
	maxArgs = map[string]int{"serve": 0, "check-config": 0, "fingerprint": 1, "version": 0, "help": 0}
	aliases = map[string]string{"--version": "version", "-v": "version", "--help": "help", "-h": "help"}
)

func text(name string) string { b, _ := texts.ReadFile("help/" + name + ".txt"); return string(b) }

// Exit statuses: 2 for bad settings or usage, so a supervisor can tell them from a crash.
const exitOK, exitFailure, exitSettings = 0, 1, 2

func main() {
	// SIGTERM and SIGINT drain, a second one stops at once; SIGHUP is caught so that its
	// default action cannot end the RTE, and rte.Run logs and ignores it.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	os.Exit(run(context.Background(), os.Args[1:], os.Environ(), os.Stdout, os.Stderr, sigs))
}

// run is the whole program behind main, with its inputs passed in.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer, sigs <-chan os.Signal) int {
	cmd := "serve"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	if alias, ok := aliases[cmd]; ok {
		cmd = alias
	}
	max, ok := maxArgs[cmd]
	if !ok {
		fmt.Fprintf(stderr, "rte: unknown command %q\n\n%s", cmd, text("rte"))
		return exitSettings
	}
	fs := flag.NewFlagSet("rte "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), text(cmd)) }
	help := fs.Bool("h", false, "print this help") // its own flag: help is the answer, to stdout
	fs.BoolVar(help, "help", false, "print this help")
	switch err := fs.Parse(args); {
	case err != nil:
		return exitSettings // the flag package printed why and the usage
	case *help:
		fs.SetOutput(stdout)
		fs.Usage()
		return exitOK
	case fs.NArg() > max:
		fmt.Fprintf(stderr, "rte %s: takes at most %d argument(s), got %q\n\n", cmd, max, fs.Args())
		fs.Usage()
		return exitSettings
	}
	switch cmd {
	case "serve":
		return serve(ctx, environ, stderr, sigs)
	case "check-config":
		return checkConfig(environ, stdout, stderr)
	case "fingerprint":
		if !rte.Fingerprint(fs.Arg(0), environ, stdout, stderr) {
			return exitFailure
		}
		return exitOK
	case "version":
		fmt.Fprintf(stdout, "rte %s (protocol %d)\n", rte.BuildVersion(version), protocol.Version)
		return exitOK
	}
	fmt.Fprint(stdout, text("rte")) // help
	return exitOK
}

func serve(ctx context.Context, environ []string, stderr io.Writer, sigs <-chan os.Signal) int {
	s, err := config.Load(environ, rte.Hostname())
	if err != nil {
		config.WriteRefusal(stderr, err)
		return exitSettings
	}
	logger, err := logging.New(s.LogLevel, s.LogFormat, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "rte: logger: %v\n", err)
		return exitSettings
	}
	defer func() { _ = logger.Sync() }()
	switch err = rte.Run(ctx, s, logger, rte.Options{Environ: environ, Signals: sigs, Version: rte.BuildVersion(version)}); {
	case errors.As(err, new(*config.Problems)):
		config.WriteRefusal(stderr, err)
		return exitSettings
	case err != nil:
		logger.Error("rte stopped", zap.Error(err))
		if errors.As(err, new(*rte.SettingsError)) {
			return exitSettings
		}
		return exitFailure
	}
	logger.Info("rte stopped")
	return exitOK
}

// checkConfig prints what the RTE would run with, then every problem serve would refuse at
// start. Settings come back filled as far as parsing got even when there are problems.
func checkConfig(environ []string, stdout, stderr io.Writer) int {
	s, err := config.Load(environ, rte.Hostname())
	p := &config.Problems{}
	if err != nil && !errors.As(err, &p) {
		config.WriteRefusal(stderr, err)
		return exitSettings
	}
	p.List = append(p.List, rte.Check(s)...)
	s.WriteReport(stdout)
	if len(p.List) > 0 {
		config.WriteRefusal(stderr, p)
		return exitSettings
	}
	fmt.Fprintln(stdout, "settings: ok")
	return exitOK
}
