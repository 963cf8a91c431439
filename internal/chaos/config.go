package chaos

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// Kind is one kind of fault.
type Kind string

// The fault kinds; docs/reliability.md says what each does and what it should cost.
const (
	RTEKill   Kind = "rte-kill"   // SIGKILL of an RTE mid-job, then a restart
	RTETerm   Kind = "rte-term"   // SIGTERM (drain) of an RTE mid-job, then a restart
	RTEHup    Kind = "rte-hup"    // SIGHUP of an RTE, which must go on as if nothing happened
	NodeKill  Kind = "node-kill"  // SIGKILL of the app node holding a runner's socket, then its restart
	Cut       Kind = "cut"        // every connection through the runner's forwarder closed
	Stall     Kind = "stall"      // the forwarder moves no byte for longer than the RTE's keepalive
	SpoolFull Kind = "spool-full" // the RTE's spool file system filled for a while, then freed
	BundleCut Kind = "bundle-cut" // the socket cut while a large bundle is on its way to the RTE
)

// Kinds is every kind, in the order the report lists them.
var Kinds = []Kind{RTEKill, RTETerm, RTEHup, NodeKill, Cut, Stall, SpoolFull, BundleCut}

// breaksSocket reports whether the fault ends the runner's socket, so that recovery needs a
// new handshake.
func (k Kind) breaksSocket() bool {
	return k != RTEHup && k != SpoolFull
}

// ParseKinds reads a comma-separated list of kinds ("" or "all" for every kind).
func ParseKinds(s string) ([]Kind, error) {
	if s == "" || s == "all" {
		return slices.Clone(Kinds), nil
	}
	var out []Kind
	for _, name := range strings.Split(s, ",") {
		k := Kind(strings.TrimSpace(name))
		if !slices.Contains(Kinds, k) {
			return nil, fmt.Errorf("-kinds: %q is not a fault kind; use a comma-separated list of %s", name, kindList())
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out, nil
}

func kindList() string {
	names := make([]string, len(Kinds))
	for i, k := range Kinds {
		names[i] = string(k)
	}
	return strings.Join(names, ", ")
}

// Config is one run of the harness.
type Config struct {
	Seed   uint64 // the fault schedule and the jobs are drawn from it
	Faults int    // how many faults to inject
	RTEs   int    // RTE processes, each with its own forwarder and spool
	Jobs   int    // jobs kept in flight
	Kinds  []Kind // the kinds to draw from; nil for all
	// Gap is the mean pause between two faults' injections (drawn from 0.2 to 1.8 times it);
	// a fault waits longer while the previous fault on its RTE has not recovered.
	Gap time.Duration
	// Recovery bounds the wait for one fault's recovery; a fault not recovered by then is
	// an invariant failure.
	Recovery time.Duration
	// Settle bounds the wait, after the last fault, for every job to end.
	Settle time.Duration
	Out    string // the work directory (logs, database, spools); "" for a temporary one
	Keep   bool   // keep the work directory
	RTEBin string // the rte binary; "" builds it
	AppBin string // the rte-app binary; "" builds it
	Race   bool   // build the binaries with -race
	Log    io.Writer
}

func (c *Config) defaults() error {
	if c.RTEs < 1 {
		return fmt.Errorf("-rtes %d: run at least 1 RTE", c.RTEs)
	}
	if c.Jobs < 1 {
		return fmt.Errorf("-jobs %d: keep at least 1 job in flight", c.Jobs)
	}
	if c.Faults < 0 {
		return fmt.Errorf("-faults %d: give 0 or more", c.Faults)
	}
	if c.Kinds == nil {
		c.Kinds = slices.Clone(Kinds)
	}
	if c.Gap <= 0 {
		c.Gap = 3 * time.Second
	}
	if c.Recovery <= 0 {
		c.Recovery = 90 * time.Second
	}
	if c.Settle <= 0 {
		c.Settle = 5 * time.Minute
	}
	if c.Log == nil {
		c.Log = os.Stdout
	}
	return nil
}
