package cli

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/internal/refapp/api"
	"github.com/rte-project/rte/internal/refapp/display"
	"github.com/rte-project/rte/protocol"
)

// `rte-app check`: a connection check through the admin API
// (POST /api/v2/runners/{name}/check_node_connections), printed as a table or as the API's JSON.

// maxCheckTimeout is the most a check may take on the runner (the RTE's own cap), so one
// request holds a connection for at most about a minute.
const maxCheckTimeout = 60 * time.Second

// checkNodeConnections asks the app to have runner check the targets. It waits the check's
// own timeout (at least the runner's 5 s default) and the slack the API gives its answer.
func (c *Client) checkNodeConnections(ctx context.Context, runner string, req api.CheckRequest) (api.CheckResponse, error) {
	var out api.CheckResponse
	limit := max(time.Duration(req.TimeoutMS)*time.Millisecond, 5*time.Second) + api.CheckAnswerSlack
	err := c.doWithin(ctx, limit, http.MethodPost, "/api/v2/runners/"+url.PathEscape(runner)+"/check_node_connections", nil, req, &out)
	return out, err
}

// checkCmd runs `rte-app check`: it asks the runner to try each target once and prints a
// table. The exit status is 0 when every target connected, ExitFailed when any did not.
func checkCmd(ctx context.Context, c *command, args []string) (int, error) {
	var targets listFlag
	runner := c.fs.String("runner", "", "the runner that tries the targets (required)")
	c.fs.Var(&targets, "target", "a target: ssh://[user@]host[:port] or winrm://host[:port]; a bare [user@]host[:port] is ssh (repeat for several)")
	timeout := c.fs.Duration("timeout", 5*time.Second, "how long the whole check may take on the runner, at most 60s")
	asJSON := c.fs.Bool("json", false, "print the JSON the app answered")
	if err := NoArgs(c.fs, args); err != nil {
		return 0, err
	}
	req, err := checkRequestFromFlags(*runner, targets, *timeout)
	if err != nil {
		return 0, usageError{err}
	}
	cl, err := c.client()
	if err != nil {
		return 0, err
	}
	res, err := cl.checkNodeConnections(ctx, *runner, req)
	if err != nil {
		return 0, err
	}
	if *asJSON {
		if err := printJSON(c.stdout, res); err != nil {
			return 0, err
		}
	} else if err := printCheck(c.stdout, res); err != nil {
		return 0, err
	}
	if res.Status != api.CheckSuccess {
		return ExitFailed, nil
	}
	return ExitOK, nil
}

// checkRequestFromFlags builds the request from the command line; an error names the flag.
func checkRequestFromFlags(runner string, targets []string, timeout time.Duration) (api.CheckRequest, error) {
	var req api.CheckRequest
	if runner == "" {
		return req, errors.New("--runner NAME is required")
	}
	if len(targets) == 0 {
		return req, errors.New("--target is required: give ssh://user@host:port or winrm://host:port, once per target")
	}
	if timeout < 0 || timeout > maxCheckTimeout {
		return req, fmt.Errorf("--timeout %s: give 0 (the runner's default of 5s) up to %s", timeout, maxCheckTimeout)
	}
	req.TimeoutMS = int((timeout + time.Millisecond - 1) / time.Millisecond)
	for _, raw := range targets {
		t, err := parseTarget(raw)
		if err != nil {
			return req, fmt.Errorf("--target %s: %w", config.Quote(redactTarget(raw)), err)
		}
		req.Targets = append(req.Targets, t)
	}
	return req, nil
}

// parseTarget reads ssh://[user@]host[:port], winrm://host[:port] or a bare [user@]host[:port]
// (ssh). The target's name is what was written, without the scheme.
func parseTarget(raw string) (protocol.CheckTarget, error) {
	text := raw
	if !strings.Contains(text, "://") {
		text = "ssh://" + text
	}
	u, err := url.Parse(text)
	if err != nil {
		return protocol.CheckTarget{}, errors.New("not a URL such as ssh://ansible@10.0.4.11:22")
	}
	t := protocol.CheckTarget{Host: u.Hostname(), Transport: strings.ToLower(u.Scheme)}
	switch {
	case t.Transport != protocol.TransportSSH && t.Transport != protocol.TransportWinRM:
		return t, fmt.Errorf("scheme %s is neither ssh:// nor winrm://", config.Quote(u.Scheme))
	case t.Host == "":
		return t, errors.New("no host")
	case (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "":
		return t, errors.New("has a path, query or fragment; give only [user@]host[:port]")
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			return t, errors.New("carries a password; the runner logs in with its own key, so give only the user")
		}
		if t.Transport == protocol.TransportWinRM {
			return t, errors.New("names a user, which a winrm check does not use: it sends no credentials")
		}
		t.User = u.User.Username()
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return t, fmt.Errorf("port %s is not a number from 1 to 65535", config.Quote(p))
		}
		t.Port = n
	}
	t.Name = strings.TrimSuffix(strings.TrimPrefix(text, u.Scheme+"://"), "/")
	return t, nil
}

// redactTarget hides a password written into a target, for the error that refuses it.
func redactTarget(raw string) string {
	at := strings.LastIndex(raw, "@")
	start := strings.Index(raw, "://") + 1 // 0 without a scheme
	if start > 0 {
		start += 2
	}
	if at < start {
		return raw
	}
	if colon := strings.Index(raw[start:at], ":"); colon >= 0 {
		return raw[:start+colon] + ":xxxxx" + raw[at:]
	}
	return raw
}

// printCheck prints one line per target and a closing count.
func printCheck(w io.Writer, res api.CheckResponse) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tHOST\tSTATUS\tLATENCY\tMESSAGE")
	connected := 0
	for _, o := range res.Result {
		if o.Status == protocol.CheckConnected {
			connected++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d ms\t%s\n", display.OneLine(OrDash(o.Name), 64), display.OneLine(OrDash(o.Host), 64),
			display.OneLine(o.Status, 32), o.LatencyMS, display.OneLine(OrDash(o.Message), 600))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%s: %d of %d targets connected\n", res.Status, connected, len(res.Result))
	return err
}
