package config

import (
	"errors"
	"fmt"
	"io"
	"strings"
)

// Problem is one bad setting: the variable and a message saying what is wrong and what to do.
// Messages never contain a secret value and are a single line.
type Problem struct {
	Var     string
	Message string
}

func (p Problem) String() string { return p.Var + ": " + p.Message }

// Problems is every bad setting found by Load, so that the operator fixes them in one round.
type Problems struct {
	List []Problem
}

// WriteRefusal writes why the RTE refuses to start with these settings, as the binary prints
// it: every problem of a *Problems in err on a line of its own, or err's text.
func WriteRefusal(w io.Writer, err error) {
	var p *Problems
	if !errors.As(err, &p) {
		fmt.Fprintf(w, "rte: settings: %v\n", err)
		return
	}
	fmt.Fprintf(w, "rte: the settings have %d problem(s); nothing was started:\n", len(p.List))
	for _, pr := range p.List {
		fmt.Fprintf(w, "  - %s\n", pr.String())
	}
}

// Error gives one problem per line, as "VAR: message".
func (p *Problems) Error() string {
	lines := make([]string, len(p.List))
	for i, pr := range p.List {
		lines[i] = pr.String()
	}
	return strings.Join(lines, "\n")
}

// Add records that variable is bad; the message is format and args, one line, with no secret
// value in it. The reference app's settings (internal/refapp/settings) list their problems here
// too, so both programs refuse a start in the same words and shape.
func (p *Problems) Add(variable, format string, args ...any) {
	p.List = append(p.List, Problem{Var: variable, Message: fmt.Sprintf(format, args...)})
}

// Quote shows an operator's value inside a message: quoted, so that stray spaces and
// carriage returns are visible, and bounded, so that one huge value does not drown the rest.
func Quote(v string) string {
	const max = 64
	if len(v) > max {
		v = v[:max] + "..."
	}
	return fmt.Sprintf("%q", v)
}
