package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/internal/refapp/api"
	"github.com/rte-project/rte/internal/refapp/display"
)

// defaultAppURL is where the CLI finds the app when neither --app nor APP_URL says.
const defaultAppURL = "http://127.0.0.1:8080"

// errUsage marks a command line that cannot be run; the flag package or the command printed
// why.
var errUsage = errors.New("usage")

// usageError is a problem with the command line or the environment, found before anything
// was sent to the app: exit 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// command is what every CLI command shares: its flags, where the app is, and the terminal.
type command struct {
	fs             *flag.FlagSet
	appURL, token  string
	stdout, stderr io.Writer
}

// Client returns a Client for the app; an error is a usageError.
func (c *command) client() (*Client, error) {
	cl, err := NewClient(c.appURL, c.token)
	if err != nil {
		return nil, usageError{err}
	}
	return cl, nil
}

// Run runs one of the commands that talk to a running app over its admin API.
func Run(ctx context.Context, name string, args, environ []string, stdout, stderr io.Writer) int {
	vars := env.ToMap(environ)
	c := &command{
		fs:     NewFlagSet(name, stdout, stderr),
		appURL: defaultAppURL,
		token:  vars["APP_ADMIN_TOKEN"],
		stdout: stdout, stderr: stderr,
	}
	if v := vars["APP_URL"]; v != "" {
		c.appURL = v
	}
	c.fs.StringVar(&c.appURL, "app", c.appURL, "the app's URL; APP_URL sets the default")
	if name == "run" || name == "follow" {
		// These follow a job and take their exit status from its end.
		code, err := followCmd(ctx, c, name, args)
		if err != nil {
			return c.fail(name, err)
		}
		return code
	}
	if name == "check" {
		code, err := checkCmd(ctx, c, args) // exit status: did every target connect
		if err != nil {
			return c.fail(name, err)
		}
		return code
	}
	var err error
	switch name {
	case "runners":
		err = runnersCmd(ctx, c, args)
	case "approve":
		err = approveCmd(ctx, c, args)
	case "reject":
		err = rejectCmd(ctx, c, args)
	case "clear-waiting":
		err = clearWaitingCmd(ctx, c, args)
	case "jobs":
		err = jobsCmd(ctx, c, args)
	case "cancel":
		err = cancelCmd(ctx, c, args)
	default:
		err = usageError{fmt.Errorf("unknown command %s", config.Quote(name))}
	}
	if err != nil {
		return c.fail(name, err)
	}
	return ExitOK
}

// fail prints a command's error (unless the flag package already said why) and returns the
// exit status: 2 for a usage problem, 1 for anything after that.
func (c *command) fail(name string, err error) int {
	switch {
	case errors.Is(err, flag.ErrHelp):
		return ExitOK
	case errors.Is(err, errUsage):
		return ExitUsage
	}
	fmt.Fprintf(c.stderr, "rte-app %s: %v\n", name, err)
	var ue usageError
	if errors.As(err, &ue) {
		return ExitUsage
	}
	return ExitTrouble
}

// parseArgs parses flags placed before and after the positional arguments, which the flag
// package alone stops at, and returns the positional ones.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, errUsage // the flag package printed why and the usage
		}
		if helpAsked(fs) {
			return nil, flag.ErrHelp
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// oneArg parses fs and wants exactly one positional argument, named what in the message.
func oneArg(fs *flag.FlagSet, args []string, what string) (string, error) {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return "", err
	}
	if len(pos) != 1 || pos[0] == "" {
		fmt.Fprintf(fs.Output(), "%s: want one %s argument, got %d\n\n", fs.Name(), what, len(pos))
		fs.Usage()
		return "", errUsage
	}
	return pos[0], nil
}

func NoArgs(fs *flag.FlagSet, args []string) error {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		fmt.Fprintf(fs.Output(), "%s: takes no arguments, got %q\n\n", fs.Name(), pos)
		fs.Usage()
		return errUsage
	}
	return nil
}

func runnersCmd(ctx context.Context, c *command, args []string) error {
	asJSON := c.fs.Bool("json", false, "print the JSON the app answered")
	if err := NoArgs(c.fs, args); err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	runners, err := cl.Runners(ctx)
	stdout := c.stdout
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, api.RunnersResponse{Runners: runners})
	}
	if len(runners) == 0 {
		fmt.Fprintln(stdout, "no runners: an RTE with APP_URL registers itself at start")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tCONNECTED\tURL\tTOKEN\tCERTIFICATE\tWAITING CERTIFICATE\tVERSION")
	for _, r := range runners {
		connected := "no"
		if r.Connected {
			connected = "yes"
			if r.Capacity != nil {
				connected = fmt.Sprintf("yes (%d/%s jobs)", r.Capacity.Running, maxJobsText(r.Capacity.MaxJobs))
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			display.OneLine(r.Name, 64), r.State, connected, display.OneLine(OrDash(r.URL), 100), OrDash(r.TokenFingerprint),
			certText(r.Certificate), certText(r.PendingCertificate), display.OneLine(OrDash(r.Version), 40))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range runners {
		if r.PendingCertificate != nil {
			fmt.Fprintf(stdout, "\n%s waits with certificate %s (sha256 %s): compare with certificate_sha256 in the RTE's \"rte starting\" log line, then: rte-app approve %s --sha256 %s\n",
				display.OneLine(r.Name, 64), r.PendingCertificate.Fingerprint, r.PendingCertificate.SHA256, display.OneLine(r.Name, 64), r.PendingCertificate.SHA256)
		}
	}
	return nil
}

func maxJobsText(n int) string {
	if n == 0 {
		return "unlimited"
	}
	return fmt.Sprint(n)
}

func certText(c *api.CertificateView) string {
	if c == nil {
		return "-"
	}
	return c.Fingerprint
}

func OrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func approveCmd(ctx context.Context, c *command, args []string) error {
	fingerprint := c.fs.String("fingerprint", "", "approve only if the waiting certificate has this short fingerprint (abcd-ef12), as the RTE logged it")
	sha := c.fs.String("sha256", "", "approve only the certificate with this full SHA-256 (64 hex digits), as the RTE logged certificate_sha256; binds the approval exactly")
	name, err := oneArg(c.fs, args, "runner NAME")
	if err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	r, err := cl.Approve(ctx, name, *fingerprint, *sha)
	if err != nil {
		return err
	}
	stdout := c.stdout
	switch {
	case r.Certificate != nil:
		fmt.Fprintf(stdout, "approved runner %s: the app dials %s and trusts only certificate %s (sha256 %s)\n", display.OneLine(r.Name, 64), display.OneLine(r.URL, 200), r.Certificate.Fingerprint, r.Certificate.SHA256)
	default:
		fmt.Fprintf(stdout, "approved runner %s (%s)\n", display.OneLine(r.Name, 64), display.OneLine(OrDash(r.URL), 200))
	}
	return nil
}

// clearWaitingCmd rejects every registration request no admin decided on yet, at once.
func clearWaitingCmd(ctx context.Context, c *command, args []string) error {
	reason := c.fs.String("reason", "", "why, for the app's log and the waiting RTEs")
	if err := NoArgs(c.fs, args); err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	names, err := cl.clearWaiting(ctx, *reason)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		fmt.Fprintln(c.stdout, "no registration request was waiting")
		return nil
	}
	fmt.Fprintf(c.stdout, "cleared %d waiting registration requests: %s\n", len(names), display.OneLine(strings.Join(names, ", "), 2000))
	return nil
}

func rejectCmd(ctx context.Context, c *command, args []string) error {
	reason := c.fs.String("reason", "", "why, for the app's log")
	name, err := oneArg(c.fs, args, "runner NAME")
	if err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	if err := cl.reject(ctx, name, *reason); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "rejected runner %s: it is removed, and registers as a new request if it starts again\n", display.OneLine(name, 64))
	return nil
}

func jobsCmd(ctx context.Context, c *command, args []string) error {
	runner := c.fs.String("runner", "", "only this runner's jobs")
	states := c.fs.String("state", "", "only jobs in these states, comma-separated: queued, dispatched, running, ended")
	limit := c.fs.Int("limit", 20, "at most this many, newest first")
	asJSON := c.fs.Bool("json", false, "print the JSON the app answered")
	if err := NoArgs(c.fs, args); err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	jobs, err := cl.Jobs(ctx, *runner, *states, *limit)
	stdout := c.stdout
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, api.JobsResponse{Jobs: jobs})
	}
	if len(jobs) == 0 {
		fmt.Fprintln(stdout, "no jobs")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tRUNNER\tSTATE\tSTATUS\tCREATED\tPLAYBOOK")
	for _, j := range jobs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", j.ID, display.OneLine(j.Runner, 64), j.State, OrDash(j.Status),
			j.CreatedAt.Local().Format(time.DateTime), display.OneLine(j.Playbook, 100))
	}
	return tw.Flush()
}

func cancelCmd(ctx context.Context, c *command, args []string) error {
	id, err := oneArg(c.fs, args, "JOB")
	if err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	j, err := cl.cancel(ctx, id)
	if err != nil {
		return err
	}
	stdout := c.stdout
	if j.State == "ended" {
		fmt.Fprintf(stdout, "job %s canceled\n", j.ID)
	} else {
		fmt.Fprintf(stdout, "job %s: cancel sent to runner %s; it ends when the runner has stopped the playbook\n", j.ID, display.OneLine(j.Runner, 64))
	}
	return nil
}

// listFlag collects a flag given several times.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// followCmd runs `run` and `follow`, whose exit status is the job's; an error is a failure
// before there was a job to follow.
func followCmd(ctx context.Context, c *command, name string, args []string) (int, error) {
	if name == "follow" {
		id, err := oneArg(c.fs, args, "JOB")
		if err != nil {
			return 0, err
		}
		cl, err := c.client()
		if err != nil {
			return 0, err
		}
		return FollowAndReport(ctx, cl, id, c.stdout, c.stderr), nil
	}
	fs := c.fs
	var (
		req                   api.JobRequest
		inventories, envs     listFlag
		extraVars             string
		tags, skipTags        string
		vaultFile, becomeFile string
		noFollow              bool
	)
	fs.StringVar(&req.Runner, "runner", "", "the runner to run on (required)")
	fs.StringVar(&req.Playbook, "playbook", "", "the playbook, relative to the runner's ANSIBLE_PATH (required)")
	fs.Var(&inventories, "inventory", "an inventory, relative to the runner's REPO_PATH (repeat for several)")
	fs.Var(&inventories, "i", "short for --inventory, as in ansible-playbook")
	fs.StringVar(&extraVars, "extra-vars", "", "extra variables as a JSON object, or @FILE holding one")
	fs.StringVar(&extraVars, "e", "", "short for --extra-vars, as in ansible-playbook")
	fs.StringVar(&req.Limit, "limit", "", "limit the run to hosts matching this pattern")
	fs.StringVar(&req.Limit, "l", "", "short for --limit, as in ansible-playbook")
	fs.StringVar(&tags, "tags", "", "only tasks with these tags, comma-separated")
	fs.StringVar(&tags, "t", "", "short for --tags, as in ansible-playbook")
	fs.StringVar(&skipTags, "skip-tags", "", "skip tasks with these tags, comma-separated")
	fs.BoolVar(&req.Check, "check", false, "check mode: change nothing")
	fs.BoolVar(&req.Diff, "diff", false, "show differences in changed files")
	fs.IntVar(&req.Verbosity, "v", 0, "verbosity 0 to 6: how many v ansible-playbook gets (-v 2 is -vv; -vv works too)")
	fs.IntVar(&req.Forks, "forks", 0, "parallel hosts; 0 for ansible's default")
	fs.Var(&envs, "env", "K=V environment for ansible-playbook (repeat for several)")
	fs.StringVar(&vaultFile, "vault-password-file", "", "file holding the vault password")
	fs.StringVar(&becomeFile, "become-password-file", "", "file holding the become password")
	fs.IntVar(&req.TimeoutS, "timeout", 3600, "seconds the playbook may run; 0 for the runner's default")
	fs.BoolVar(&noFollow, "no-follow", false, "print the job id and return at once")
	if err := NoArgs(fs, verbosityArgs(args)); err != nil {
		return 0, err
	}
	req.Inventories = inventories
	req.Tags, req.SkipTags = splitList(tags), splitList(skipTags)
	if err := completeRequest(&req, extraVars, envs, vaultFile, becomeFile); err != nil {
		return 0, usageError{err}
	}
	cl, err := c.client()
	if err != nil {
		return 0, err
	}
	if req.Secrets != nil && !safeTransport(cl.base) {
		fmt.Fprintf(c.stderr, "rte-app run: warning: sending secrets to %s over plain http; use https:// for an app that is not on this machine\n", cl.base.Host)
	}
	job, err := cl.Submit(ctx, req)
	if err != nil {
		return 0, err
	}
	if noFollow {
		fmt.Fprintln(c.stdout, job.ID)
		return ExitOK, nil
	}
	fmt.Fprintf(c.stderr, "rte-app: job %s queued on runner %s\n", job.ID, display.OneLine(job.Runner, 64))
	return FollowAndReport(ctx, cl, job.ID, c.stdout, c.stderr), nil
}

// completeRequest fills what needs reading or checking beyond the flags; an error names the
// flag.
func completeRequest(req *api.JobRequest, extraVars string, envs []string, vaultFile, becomeFile string) error {
	var missing []string
	if req.Runner == "" {
		missing = append(missing, "--runner NAME")
	}
	if req.Playbook == "" {
		missing = append(missing, "--playbook FILE")
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s required", strings.Join(missing, " and "))
	}
	if extraVars != "" {
		text := []byte(extraVars)
		if path, ok := strings.CutPrefix(extraVars, "@"); ok {
			b, err := os.ReadFile(path)
			if err != nil {
				return fmt.Errorf("--extra-vars: %w", err)
			}
			text = b
		}
		var obj map[string]any
		if err := json.Unmarshal(text, &obj); err != nil || obj == nil {
			return fmt.Errorf("--extra-vars: want a JSON object such as '{\"version\": \"1.2\"}' (or @FILE holding one)")
		}
		req.Extravars = bytes.TrimSpace(text)
	}
	for _, kv := range envs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("--env %s: want NAME=VALUE", config.Quote(kv))
		}
		if req.Env == nil {
			req.Env = map[string]string{}
		}
		req.Env[k] = v
	}
	for _, f := range []struct {
		flag, path string
		set        func(*api.JobSecrets, string)
	}{
		{"--vault-password-file", vaultFile, func(s *api.JobSecrets, v string) { s.VaultPassword = v }},
		{"--become-password-file", becomeFile, func(s *api.JobSecrets, v string) { s.BecomePassword = v }},
	} {
		if f.path == "" {
			continue
		}
		b, err := os.ReadFile(f.path)
		if err != nil {
			return fmt.Errorf("%s: %w", f.flag, err)
		}
		// Ansible drops the line end of a password file; so do we.
		v := strings.TrimRight(string(b), "\r\n")
		if v == "" {
			return fmt.Errorf("%s: %s is empty", f.flag, f.path)
		}
		if req.Secrets == nil {
			req.Secrets = &api.JobSecrets{}
		}
		f.set(req.Secrets, v)
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, t := range strings.Split(s, ",") {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}

// safeTransport reports whether secrets sent to u stay off the network or are encrypted.
func safeTransport(u *url.URL) bool {
	if u.Scheme == "https" {
		return true
	}
	host := u.Hostname()
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
