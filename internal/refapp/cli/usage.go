package cli

import (
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// commandHelp is each command's synopsis and what it does: the head of its -h/--help answer.
var commandHelp = map[string]struct{ synopsis, what string }{
	"serve":         {"", "Run the reference app: registration, the admin API and page, dispatch. Settings come from the environment (docs/reference-app.md)."},
	"runners":       {"[flags]", "List the runners with their fingerprints and connection."},
	"approve":       {"[flags] NAME", "Approve a runner; with --sha256 (or --fingerprint), only if that certificate is the one waiting."},
	"reject":        {"[flags] NAME", "Reject and remove a runner."},
	"clear-waiting": {"[flags]", "Reject every registration request still waiting for an admin, at once."},
	"run": {"--runner NAME --playbook FILE [flags]", "Run a playbook and follow it to its end; the exit status is the job's.\n" +
		"ansible-playbook's short flags work too: -i INVENTORY, -e EXTRA_VARS, -l LIMIT, -t TAGS, -v ... -vvvvvv."},
	"follow": {"[flags] JOB", "Follow a job from its first record to its end; the exit status is the job's."},
	"jobs":   {"[flags]", "List jobs, newest first."},
	"cancel": {"[flags] JOB", "Cancel a job."},
	"check":  {"--runner NAME --target URL... [flags]", "Ask a runner whether it can reach these hosts now; exit 0 when all connected, 4 when not."},
	"demo":   {"[flags]", "Run the reference app, a real RTE over TLS and a real playbook on this machine."},
	"help":   {"", "Print the list of commands."},
}

// helpFlag is -h and --help. It is a flag of every command rather than the flag package's
// built-in answer so that help goes to stdout with exit 0 (it is what was asked for), while a
// refused command line prints the same usage to stderr with exit 2.
type helpFlag struct {
	asked  bool
	stdout io.Writer
}

func (h *helpFlag) String() string   { return strconv.FormatBool(h != nil && h.asked) }
func (h *helpFlag) IsBoolFlag() bool { return true }
func (h *helpFlag) Set(v string) error {
	b, err := strconv.ParseBool(v)
	h.asked = b
	return err
}

// NewFlagSet returns the flag set of command name: errors and usage go to stderr, -h and
// --help to stdout.
func NewFlagSet(name string, stdout, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("rte-app "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	h := &helpFlag{stdout: stdout}
	fs.Var(h, "h", "print this help")
	fs.Var(h, "help", "print this help")
	fs.Usage = func() {
		help := commandHelp[name]
		w := fs.Output()
		fmt.Fprintf(w, "usage: %s %s\n\n%s\n", fs.Name(), help.synopsis, help.what)
		flags := 0
		fs.VisitAll(func(*flag.Flag) { flags++ })
		if flags > 2 { // more than -h and --help
			fmt.Fprintln(w, "\nflags:")
			fs.PrintDefaults()
		}
	}
	return fs
}

// helpAsked reports whether -h or --help was given; if so it has printed the usage to stdout.
func helpAsked(fs *flag.FlagSet) bool {
	f := fs.Lookup("help")
	if f == nil {
		return false
	}
	h, ok := f.Value.(*helpFlag)
	if !ok || !h.asked {
		return false
	}
	out := fs.Output()
	fs.SetOutput(h.stdout)
	fs.Usage()
	fs.SetOutput(out)
	return true
}

// verbosityArgs turns ansible-playbook's -v, -vv ... -vvvvvv into this CLI's -v N, leaving
// -v N and everything after "--" as they are.
func verbosityArgs(args []string) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		n := strings.Count(a, "v")
		if len(a) >= 2 && a[0] == '-' && n == len(a)-1 && n <= 6 {
			if n == 1 && i+1 < len(args) {
				if _, err := strconv.Atoi(args[i+1]); err == nil {
					out = append(out, a) // -v N: the count follows
					continue
				}
			}
			a = "-v=" + strconv.Itoa(n)
		}
		out = append(out, a)
	}
	return out
}

// Commands names every command that answers -h and --help, serve, demo and help included.
func Commands() []string {
	names := make([]string, 0, len(commandHelp))
	for name := range commandHelp {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}
