package main

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/protocol"
)

// Connection checks through the admin API: POST /api/v2/runners/{name}/check_node_connections
// and `rte-app check`. The answer has the shape of bolt server's check_node_connections, which
// operators of AWX-era tooling already read: a status for the whole check and one entry per
// target.

const (
	// checkSchemaName names the request schema; docs/schemas/api holds the same file.
	checkSchemaName = "check-node-connections-request.schema.json"
	// maxCheckBody bounds the request: 1000 targets of a few hundred bytes each.
	maxCheckBody = 1 << 20
	// maxCheckTimeout is the most a check may take on the runner (the RTE's own cap), so one
	// request holds a connection for at most about a minute.
	maxCheckTimeout = 60 * time.Second
	// checkAnswerSlack is how much longer than the check's timeout the HTTP side gives the
	// answer: the app waits its own margin for the runner, and the answer must then be written.
	checkAnswerSlack = 15 * time.Second
	// maxSchemaProblems bounds the problems one 400 lists; the first few say what to fix.
	maxSchemaProblems = 5
)

// Check statuses of the whole answer, as bolt server names them.
const (
	checkSuccess = "success" // every target connected
	checkFailure = "failure" // at least one did not
)

//go:embed schemas/check-node-connections-request.schema.json
var checkSchemaJSON []byte

// checkSchema is the compiled request schema. The embedded file is part of the binary, so a
// schema that does not compile is a build mistake, and the tests compile it.
var checkSchema = sync.OnceValue(func() *jsonschema.Schema {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(checkSchemaJSON))
	if err != nil {
		panic("rte-app: embedded " + checkSchemaName + " is not JSON: " + err.Error())
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource(checkSchemaName, doc); err != nil {
		panic("rte-app: embedded " + checkSchemaName + ": " + err.Error())
	}
	return c.MustCompile(checkSchemaName)
})

// schemaPrinter renders the schema's complaints in English.
var schemaPrinter = message.NewPrinter(language.English)

// checkRequest is the body of check_node_connections; the schema has checked it before it is
// decoded into this.
type checkRequest struct {
	Targets   []protocol.CheckTarget `json:"targets"`
	TimeoutMS int                    `json:"timeout_ms,omitempty"`
}

// checkResponse is the answer: status is success when every target connected, failure
// otherwise; result has one entry per target, in the order of the request.
type checkResponse struct {
	Status string                  `json:"status"`
	Result []protocol.CheckOutcome `json:"result"`
}

// parseCheckRequest checks body against the schema and decodes it. An error is a 400 *refusal
// naming each field that is wrong.
func parseCheckRequest(body []byte) (checkRequest, error) {
	var req checkRequest
	if len(bytes.TrimSpace(body)) == 0 {
		return req, refuse(http.StatusBadRequest, `body: empty; send a JSON object such as {"targets": [{"host": "10.0.4.11", "user": "ansible"}], "timeout_ms": 5000}`)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return req, refuse(http.StatusBadRequest, "body: not valid JSON: %s", clip(err.Error(), 200))
	}
	if err := checkSchema().Validate(doc); err != nil {
		return req, refuse(http.StatusBadRequest, "%s", schemaProblems(err))
	}
	if err := json.Unmarshal(body, &req); err != nil {
		// Only a number the schema takes as an integer and Go does not (22.0) gets here.
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return req, refuse(http.StatusBadRequest, "%s: must be a whole number written without a fraction, not %s", te.Field, te.Value)
		}
		return req, refuse(http.StatusBadRequest, "body: %s", clip(err.Error(), 200))
	}
	for i := range req.Targets {
		t := &req.Targets[i]
		if t.Transport == "" {
			t.Transport = protocol.TransportSSH
		}
		if t.Name == "" {
			t.Name = t.Host
		}
	}
	return req, nil
}

// schemaProblems lists what the schema refused, each as "field: problem", the field written
// as targets[2].port.
func schemaProblems(err error) string {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return "body: " + clip(err.Error(), 300)
	}
	var out []string
	seen := map[string]bool{}
	add := func(path []string, problem string) {
		line := fieldPath(path) + ": " + problem
		if !seen[line] {
			seen[line] = true
			out = append(out, line)
		}
	}
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) > 0 {
			for _, c := range e.Causes {
				walk(c)
			}
			return
		}
		path := e.InstanceLocation
		switch k := e.ErrorKind.(type) {
		case *kind.Required:
			for _, f := range k.Missing {
				add(append(path[:len(path):len(path)], f), "is required")
			}
		case *kind.AdditionalProperties:
			for _, f := range k.Properties {
				add(append(path[:len(path):len(path)], f), "unknown field; docs/connection-checks.md lists the fields")
			}
		default:
			add(path, clip(e.ErrorKind.LocalizedString(schemaPrinter), 200))
		}
	}
	walk(ve)
	if len(out) > maxSchemaProblems {
		out = append(out[:maxSchemaProblems], fmt.Sprintf("and %d more", len(out)-maxSchemaProblems))
	}
	return strings.Join(out, "; ")
}

// fieldPath writes a JSON pointer's tokens as targets[2].port; the whole body is "body".
func fieldPath(tokens []string) string {
	if len(tokens) == 0 {
		return "body"
	}
	var b strings.Builder
	for i, tok := range tokens {
		if _, err := strconv.Atoi(tok); err == nil && i > 0 {
			b.WriteString("[" + tok + "]")
			continue
		}
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(clip(tok, 64))
	}
	return b.String()
}

func (h *api) checkNodeConnections(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxCheckBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, http.StatusRequestEntityTooLarge, "body: larger than %d bytes; split the targets over several checks", maxCheckBody)
			return
		}
		writeError(w, http.StatusBadRequest, "body: could not be read: %s", clip(err.Error(), 200))
		return
	}
	req, err := parseCheckRequest(body)
	if err != nil {
		h.writeFailure(w, "check node connections", err)
		return
	}
	runner, err := h.lookupRunner(r.Context(), name)
	if err != nil {
		h.writeFailure(w, "check node connections", err)
		return
	}
	if runner.State != app.StateApproved {
		writeError(w, http.StatusConflict, "runner %s is %s, not approved: approve it first (POST /api/v2/runners/%s/approve)", quote(name), runner.State, url.PathEscape(name))
		return
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	// The body is read; the check may outlast the server's read and write timeouts, which
	// would otherwise cancel the request or cut the answer.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Now().Add(max(timeout, 5*time.Second) + checkAnswerSlack))

	res, err := h.app.Check(r.Context(), name, req.Targets, timeout)
	var fe *protocol.FieldError
	switch {
	case err == nil:
	case errors.As(err, &fe):
		writeError(w, http.StatusBadRequest, "%s: %s", fe.Field, fe.Reason)
		return
	case errors.Is(err, app.ErrNotConnected), errors.Is(err, app.ErrCheckRefused):
		writeError(w, http.StatusConflict, "%v", err)
		return
	case errors.Is(err, app.ErrCheckUnanswered):
		writeError(w, http.StatusGatewayTimeout, "%v", err)
		return
	default:
		h.internal(w, "check node connections", err)
		return
	}
	writeJSON(w, http.StatusOK, newCheckResponse(res))
}

func newCheckResponse(res protocol.CheckResult) checkResponse {
	out := checkResponse{Status: checkSuccess, Result: res.Results}
	if out.Result == nil {
		out.Result = []protocol.CheckOutcome{}
	}
	for _, o := range out.Result {
		if o.Status != protocol.CheckConnected {
			out.Status = checkFailure
		}
	}
	return out
}

func (c *client) checkNodeConnections(ctx context.Context, runner string, req checkRequest) (checkResponse, error) {
	var out checkResponse
	limit := max(time.Duration(req.TimeoutMS)*time.Millisecond, 5*time.Second) + checkAnswerSlack
	err := c.doWithin(ctx, limit, http.MethodPost, "/api/v2/runners/"+url.PathEscape(runner)+"/check_node_connections", nil, req, &out)
	return out, err
}

// checkCmd runs `rte-app check`: it asks the runner to try each target once and prints a
// table. The exit status is 0 when every target connected, exitFailed when any did not.
func checkCmd(ctx context.Context, c *command, args []string) (int, error) {
	var targets listFlag
	runner := c.fs.String("runner", "", "the runner that tries the targets (required)")
	c.fs.Var(&targets, "target", "a target: ssh://[user@]host[:port] or winrm://host[:port]; a bare [user@]host[:port] is ssh (repeat for several)")
	timeout := c.fs.Duration("timeout", 5*time.Second, "how long the whole check may take on the runner, at most 60s")
	asJSON := c.fs.Bool("json", false, "print the JSON the app answered")
	if err := noArgs(c.fs, args); err != nil {
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
	if res.Status != checkSuccess {
		return exitFailed, nil
	}
	return exitOK, nil
}

// checkRequestFromFlags builds the request from the command line; an error names the flag.
func checkRequestFromFlags(runner string, targets []string, timeout time.Duration) (checkRequest, error) {
	var req checkRequest
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
			return req, fmt.Errorf("--target %s: %w", quote(redactTarget(raw)), err)
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
		return t, fmt.Errorf("scheme %s is neither ssh:// nor winrm://", quote(u.Scheme))
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
			return t, fmt.Errorf("port %s is not a number from 1 to 65535", quote(p))
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
func printCheck(w io.Writer, res checkResponse) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tHOST\tSTATUS\tLATENCY\tMESSAGE")
	connected := 0
	for _, o := range res.Result {
		if o.Status == protocol.CheckConnected {
			connected++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d ms\t%s\n", oneLine(orDash(o.Name), 64), oneLine(orDash(o.Host), 64),
			oneLine(o.Status, 32), o.LatencyMS, oneLine(orDash(o.Message), 600))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%s: %d of %d targets connected\n", res.Status, connected, len(res.Result))
	return err
}
