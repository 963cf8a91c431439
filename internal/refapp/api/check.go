package api

import (
	"bytes"
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
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/internal/refapp/display"
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
	// CheckAnswerSlack is how much longer than the check's timeout the HTTP side gives the
	// answer: the app waits its own margin for the runner, and the answer must then be written.
	CheckAnswerSlack = 15 * time.Second
	// maxSchemaProblems bounds the problems one 400 lists; the first few say what to fix.
	maxSchemaProblems = 5
)

// Check statuses of the whole answer, as bolt server names them.
const (
	CheckSuccess = "success" // every target connected
	CheckFailure = "failure" // at least one did not
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

// CheckRequest is the body of check_node_connections; the schema has checked it before it is
// decoded into this.
type CheckRequest struct {
	Targets   []protocol.CheckTarget `json:"targets"`
	TimeoutMS int                    `json:"timeout_ms,omitempty"`
}

// CheckResponse is the answer: status is success when every target connected, failure
// otherwise; result has one entry per target, in the order of the request.
type CheckResponse struct {
	Status string                  `json:"status"`
	Result []protocol.CheckOutcome `json:"result"`
}

// parseCheckRequest checks body against the schema and decodes it. An error is a 400 *Refusal
// naming each field that is wrong.
func parseCheckRequest(body []byte) (CheckRequest, error) {
	var req CheckRequest
	if len(bytes.TrimSpace(body)) == 0 {
		return req, Refuse(http.StatusBadRequest, `body: empty; send a JSON object such as {"targets": [{"host": "10.0.4.11", "user": "ansible"}], "timeout_ms": 5000}`)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return req, Refuse(http.StatusBadRequest, "body: not valid JSON: %s", display.OneLine(err.Error(), 200))
	}
	if err := checkSchema().Validate(doc); err != nil {
		return req, Refuse(http.StatusBadRequest, "%s", schemaProblems(err))
	}
	if err := json.Unmarshal(body, &req); err != nil {
		// Only a number the schema takes as an integer and Go does not (22.0) gets here.
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return req, Refuse(http.StatusBadRequest, "%s: must be a whole number written without a fraction, not %s", te.Field, te.Value)
		}
		return req, Refuse(http.StatusBadRequest, "body: %s", display.OneLine(err.Error(), 200))
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
		return "body: " + display.OneLine(err.Error(), 300)
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
			add(path, display.OneLine(e.ErrorKind.LocalizedString(schemaPrinter), 200))
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
		b.WriteString(display.OneLine(tok, 64))
	}
	return b.String()
}

func (h *API) checkNodeConnections(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxCheckBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, http.StatusRequestEntityTooLarge, "body: larger than %d bytes; split the targets over several checks", maxCheckBody)
			return
		}
		writeError(w, http.StatusBadRequest, "body: could not be read: %s", display.OneLine(err.Error(), 200))
		return
	}
	req, err := parseCheckRequest(body)
	if err != nil {
		h.writeFailure(w, "check node connections", err)
		return
	}
	runner, err := h.LookupRunner(r.Context(), name)
	if err != nil {
		h.writeFailure(w, "check node connections", err)
		return
	}
	if runner.State != app.StateApproved {
		writeError(w, http.StatusConflict, "runner %s is %s, not approved: approve it first (POST /api/v2/runners/%s/approve)", config.Quote(name), runner.State, url.PathEscape(name))
		return
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	// The body is read; the check may outlast the server's read and write timeouts, which
	// would otherwise cancel the request or cut the answer.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Now().Add(max(timeout, 5*time.Second) + CheckAnswerSlack))

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

func newCheckResponse(res protocol.CheckResult) CheckResponse {
	out := CheckResponse{Status: CheckSuccess, Result: res.Results}
	if out.Result == nil {
		out.Result = []protocol.CheckOutcome{}
	}
	for _, o := range out.Result {
		if o.Status != protocol.CheckConnected {
			out.Status = CheckFailure
		}
	}
	return out
}
