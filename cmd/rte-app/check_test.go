package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/protocol"
)

const checkPath = "/api/v2/runners/%s/check_node_connections"

// TestCheckSchemaIsDocumented keeps the embedded schema and the one in docs/ the same file.
func TestCheckSchemaIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/schemas/api/" + checkSchemaName)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(doc, checkSchemaJSON) {
		t.Fatalf("docs/schemas/api/%s differs from the schema embedded in rte-app (cmd/rte-app/schemas): copy one over the other", checkSchemaName)
	}
	checkSchema() // panics if it does not compile
}

func TestCheckRefusesBadRequests(t *testing.T) {
	ta := startTestApp(t)
	many := `{"targets":[` + strings.TrimSuffix(strings.Repeat(`{"host":"h"},`, 1001), ",") + `]}`
	for _, tc := range []struct {
		name, body string
		want       []string // each must be in the error
	}{
		{"empty", ``, []string{"body: empty"}},
		{"not json", `{"targets":`, []string{"body: not valid JSON"}},
		{"array", `[{"host":"h"}]`, []string{"body: got array, want object"}},
		{"no targets", `{"timeout_ms":5000}`, []string{"targets: is required"}},
		{"targets empty", `{"targets":[]}`, []string{"targets: minItems"}},
		{"targets not an array", `{"targets":{"host":"h"}}`, []string{"targets: got object, want array"}},
		{"too many targets", many, []string{"targets: maxItems"}},
		{"host missing", `{"targets":[{"name":"web01"}]}`, []string{"targets[0].host: is required"}},
		{"host empty", `{"targets":[{"host":""}]}`, []string{"targets[0].host: minLength"}},
		{"host with a user", `{"targets":[{"host":"root@h"}]}`, []string{"targets[0].host", "does not match pattern"}},
		{"host with a control character", `{"targets":[{"host":"h\u001b[2J"}]}`, []string{"targets[0].host", "does not match pattern"}},
		{"port a string", `{"targets":[{"host":"h","port":"22"}]}`, []string{"targets[0].port: got string, want integer"}},
		{"port too big", `{"targets":[{"host":"h"},{"host":"h","port":70000}]}`, []string{"targets[1].port: maximum"}},
		{"port a fraction", `{"targets":[{"host":"h","port":22.5}]}`, []string{"targets[0].port: got number, want integer"}},
		{"port written 22.0", `{"targets":[{"host":"h","port":22.0}]}`, []string{"port: must be a whole number"}},
		{"transport unknown", `{"targets":[{"host":"h","transport":"telnet"}]}`, []string{"targets[0].transport", "ssh", "winrm"}},
		{"unknown key", `{"targets":[{"host":"h"}],"timeout":5}`, []string{"timeout: unknown field"}},
		{"unknown target key", `{"targets":[{"host":"h","password":"x"}]}`, []string{"targets[0].password: unknown field"}},
		{"timeout too long", `{"targets":[{"host":"h"}],"timeout_ms":60001}`, []string{"timeout_ms: maximum"}},
		{"timeout negative", `{"targets":[{"host":"h"}],"timeout_ms":-1}`, []string{"timeout_ms: minimum"}},
		{"several problems", `{"targets":[{"port":0},{"host":"h","user":7}]}`, []string{"targets[0].host: is required", "targets[1].user: got number, want string"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := ta.call(t, http.MethodPost, fmt.Sprintf(checkPath, "r1"), tc.body)
			var e errorResponse
			if status != http.StatusBadRequest || json.Unmarshal(body, &e) != nil {
				t.Fatalf("POST %s: got %d %s, want 400 with a JSON error", tc.body, status, body)
			}
			for _, w := range tc.want {
				if !strings.Contains(e.Error, w) {
					t.Errorf("error %q does not say %q", e.Error, w)
				}
			}
		})
	}
	if status, body := ta.call(t, http.MethodPost, fmt.Sprintf(checkPath, "r1"), `{"targets":[`+strings.Repeat(" ", maxCheckBody)+`]}`); status != http.StatusRequestEntityTooLarge {
		t.Errorf("a body over %d bytes: got %d %s, want 413", maxCheckBody, status, body)
	}
	good := `{"targets":[{"host":"10.0.4.11"}]}`
	for _, tc := range []struct {
		name, runner, auth string
		status             int
		says               string
	}{
		{"no token", "r1", "", http.StatusUnauthorized, "missing Authorization"},
		{"unknown runner", "nope", "Bearer " + testAdminToken, http.StatusNotFound, `no runner named`},
		{"runner not connected", "r1", "Bearer " + testAdminToken, http.StatusConflict, "not connected"},
	} {
		status, body := ta.callAs(t, http.MethodPost, fmt.Sprintf(checkPath, tc.runner), good, tc.auth)
		if status != tc.status || !strings.Contains(string(body), tc.says) {
			t.Errorf("%s: got %d %s, want %d saying %q", tc.name, status, body, tc.status, tc.says)
		}
	}
}

// fakeOutbound is an approved outbound runner of the test app that answers every check:
// hosts starting with "up" connected, every other host unreachable.
type fakeOutbound struct {
	ws     *websocket.Conn
	done   chan struct{}
	mu     sync.Mutex
	checks []protocol.Check
}

func joinFakeOutbound(t *testing.T, ta *testApp, name string) *fakeOutbound {
	t.Helper()
	const token = "outbound-token-0123456789abcdef"
	if err := ta.App.AddRunner(context.Background(), &app.Runner{Name: name, Mode: protocol.ModeOutbound, Token: token}); err != nil {
		t.Fatal(err)
	}
	h := http.Header{"Authorization": {"Bearer " + token}, protocol.HeaderRTEName: {name}}
	d := websocket.Dialer{Subprotocols: []string{protocol.Subprotocol}, HandshakeTimeout: 10 * time.Second}
	ws, resp, err := d.Dial("ws"+strings.TrimPrefix(ta.URL, "http")+protocol.OutboundSocketPath, h)
	if err != nil {
		var answer []byte
		if resp != nil {
			answer, _ = io.ReadAll(resp.Body)
		}
		t.Fatalf("dial the app as runner %s: %v %s", name, err, answer)
	}
	resp.Body.Close()
	f := &fakeOutbound{ws: ws, done: make(chan struct{})}
	hello, _ := protocol.Encode(&protocol.Hello{Protocol: protocol.Version, Name: name, Version: "1.2.3", Instance: "test",
		Mode: protocol.ModeOutbound, Files: protocol.FilesLocal, MaxJobs: 1, Running: []string{}, Spooled: []protocol.SpooledJob{},
		TokenFingerprint: protocol.TokenFingerprint(token)})
	if err := ws.WriteMessage(websocket.TextMessage, hello); err != nil {
		t.Fatal(err)
	}
	go f.serve()
	t.Cleanup(func() {
		ws.Close()
		<-f.done
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if st, ok := ta.App.Status(name); ok && st.Connected {
			return f
		}
		if time.Now().After(deadline) {
			t.Fatalf("runner %s did not connect within 10s", name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (f *fakeOutbound) serve() {
	defer close(f.done)
	for {
		_, data, err := f.ws.ReadMessage()
		if err != nil {
			return
		}
		m, err := protocol.Decode(data)
		c, ok := m.(*protocol.Check)
		if err != nil || !ok {
			continue // welcome, capacity questions: not this fake's business
		}
		f.mu.Lock()
		f.checks = append(f.checks, *c)
		f.mu.Unlock()
		res := protocol.CheckResult{ID: c.ID, Results: []protocol.CheckOutcome{}}
		for _, t := range c.Targets {
			o := protocol.CheckOutcome{Name: t.Name, Host: t.Host, Status: protocol.CheckUnreachable, Message: "connection refused", LatencyMS: 1}
			if strings.HasPrefix(t.Host, "up") {
				o.Status, o.Message = protocol.CheckConnected, ""
			}
			res.Results = append(res.Results, o)
		}
		b, _ := protocol.Encode(&res)
		if f.ws.WriteMessage(websocket.TextMessage, b) != nil {
			return
		}
	}
}

func (f *fakeOutbound) lastCheck(t *testing.T) protocol.Check {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.checks) == 0 {
		t.Fatal("the runner got no check")
	}
	return f.checks[len(f.checks)-1]
}

func TestCheckAnswersLikeBolt(t *testing.T) {
	ta := startTestApp(t)
	rte := joinFakeOutbound(t, ta, "out1")

	status, body := ta.call(t, http.MethodPost, fmt.Sprintf(checkPath, "out1"),
		`{"targets":[{"host":"up1","user":"ansible","port":2222},{"name":"db","host":"down1","transport":"winrm"}],"timeout_ms":1500}`)
	if status != http.StatusOK {
		t.Fatalf("check: got %d %s, want 200", status, body)
	}
	var res map[string]any
	if err := json.Unmarshal(body, &res); err != nil {
		t.Fatal(err)
	}
	want := `{"result":[{"host":"up1","latency_ms":1,"message":"","name":"up1","status":"connected"},` +
		`{"host":"down1","latency_ms":1,"message":"connection refused","name":"db","status":"unreachable"}],"status":"failure"}`
	if got, _ := json.Marshal(res); string(got) != want {
		t.Fatalf("answer\n got %s\nwant %s", got, want)
	}
	c := rte.lastCheck(t)
	if c.TimeoutMS != 1500 || c.Targets[0] != (protocol.CheckTarget{Name: "up1", Host: "up1", Port: 2222, User: "ansible", Transport: "ssh"}) ||
		c.Targets[1].Transport != "winrm" {
		t.Fatalf("the runner got %+v, want timeout_ms 1500, the name defaulting to the host and the transport to ssh", c)
	}

	status, body = ta.call(t, http.MethodPost, fmt.Sprintf(checkPath, "out1"), `{"targets":[{"host":"up1"},{"host":"up2"}]}`)
	if status != http.StatusOK || !strings.HasPrefix(string(body), `{"status":"success"`) {
		t.Fatalf("all connected: got %d %s, want 200 with status success", status, body)
	}
	if c := rte.lastCheck(t); c.TimeoutMS != 0 {
		t.Fatalf("no timeout_ms in the request, the runner got %d, want 0 (its default)", c.TimeoutMS)
	}
}

func TestCheckCommand(t *testing.T) {
	ta := startTestApp(t)
	rte := joinFakeOutbound(t, ta, "out1")

	code, stdout, stderr := ta.runCLI(t, "check", "--runner", "out1", "--target", "ssh://ansible@up1:2222", "--target", "up2", "--timeout", "2500ms")
	if code != exitOK || !strings.Contains(stdout, "success: 2 of 2 targets connected") || !strings.Contains(stdout, "ansible@up1:2222") {
		t.Fatalf("check of hosts that connect: exit %d, want 0\nstdout %s\nstderr %s", code, stdout, stderr)
	}
	c := rte.lastCheck(t)
	if c.TimeoutMS != 2500 || c.Targets[0] != (protocol.CheckTarget{Name: "ansible@up1:2222", Host: "up1", Port: 2222, User: "ansible", Transport: "ssh"}) ||
		c.Targets[1] != (protocol.CheckTarget{Name: "up2", Host: "up2", Transport: "ssh"}) {
		t.Fatalf("the runner got %+v, want the targets as the flags gave them", c)
	}

	code, stdout, stderr = ta.runCLI(t, "check", "--runner", "out1", "--target", "up1", "--target", "winrm://down1:5985")
	if code != exitFailed || !strings.Contains(stdout, "failure: 1 of 2 targets connected") || !strings.Contains(stdout, "connection refused") {
		t.Fatalf("check with an unreachable host: exit %d, want %d\nstdout %s\nstderr %s", code, exitFailed, stdout, stderr)
	}
	code, stdout, _ = ta.runCLI(t, "check", "--runner", "out1", "--target", "down1", "--json")
	var res checkResponse
	if code != exitFailed || json.Unmarshal([]byte(stdout), &res) != nil || res.Status != checkFailure || len(res.Result) != 1 {
		t.Fatalf("check --json: exit %d, stdout %s; want %d and the app's JSON", code, stdout, exitFailed)
	}

	code, _, stderr = ta.runCLI(t, "check", "--runner", "r1", "--target", "h")
	if code != exitTrouble || !strings.Contains(stderr, "409") || !strings.Contains(stderr, "not connected") {
		t.Fatalf("check on a runner that is not connected: exit %d, stderr %s; want %d saying 409, not connected", code, stderr, exitTrouble)
	}
}

func TestCheckCommandRefusals(t *testing.T) {
	ta := startTestApp(t)
	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"no runner", []string{"--target", "h"}, "--runner NAME is required"},
		{"no target", []string{"--runner", "r1"}, "--target is required"},
		{"timeout too long", []string{"--runner", "r1", "--target", "h", "--timeout", "2m"}, "--timeout 2m0s"},
		{"unknown scheme", []string{"--runner", "r1", "--target", "telnet://h"}, "neither ssh:// nor winrm://"},
		{"password", []string{"--runner", "r1", "--target", "ssh://root:secret@h"}, "carries a password"},
		{"winrm user", []string{"--runner", "r1", "--target", "winrm://admin@h"}, "does not use"},
		{"bad port", []string{"--runner", "r1", "--target", "h:99999"}, "port \"99999\""},
		{"path", []string{"--runner", "r1", "--target", "ssh://h/x"}, "path"},
		{"no host", []string{"--runner", "r1", "--target", "ssh://:22"}, "no host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := ta.runCLI(t, append([]string{"check"}, tc.args...)...)
			if code != exitUsage || !strings.Contains(stderr, tc.says) {
				t.Fatalf("rte-app check %q: exit %d, stderr %q; want %d saying %q", tc.args, code, stderr, exitUsage, tc.says)
			}
			if strings.Contains(stderr, "secret") {
				t.Fatalf("the password reached the error: %q", stderr)
			}
		})
	}
}

// FuzzParseCheckRequest feeds bodies as any holder of the admin token may send them: a body
// is refused with a 400 naming a field, or accepted as a check the protocol takes.
func FuzzParseCheckRequest(f *testing.F) {
	f.Add([]byte(`{"targets":[{"name":"web01","host":"10.0.4.11","port":22,"user":"ansible"},{"host":"w","transport":"winrm"}],"timeout_ms":5000}`))
	f.Add([]byte(`{"targets":[{"host":"h","port":22.0}]}`))
	f.Add([]byte(`{"targets":[{"host":"h","port":1e400}]}`))
	f.Add([]byte(`{"targets":[{"host":"h\u0000"}],"targets":[]}`))
	f.Add([]byte(`[{"host":"h"}]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := parseCheckRequest(body)
		if err != nil {
			var ref *refusal
			if !errors.As(err, &ref) || ref.status != http.StatusBadRequest || !strings.Contains(ref.msg, ": ") {
				t.Fatalf("refusal %v, want a 400 naming a field", err)
			}
			return
		}
		c := protocol.Check{ID: "fuzz", Targets: req.Targets, TimeoutMS: req.TimeoutMS}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted %q, which the protocol refuses: %v", body, err)
		}
		if len(req.Targets) < 1 || len(req.Targets) > 1000 || req.TimeoutMS > 60000 {
			t.Fatalf("accepted %q: %d targets, timeout_ms %d", body, len(req.Targets), req.TimeoutMS)
		}
		for _, tg := range req.Targets {
			if tg.Name == "" || strings.IndexFunc(tg.Host, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '/' || r == '@' }) >= 0 {
				t.Fatalf("accepted target %+v from %q: want a name and a bare host", tg, body)
			}
		}
	})
}

// FuzzParseTarget: a target the CLI takes is one the protocol takes, and never carries a
// password into the request.
func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"ssh://ansible@10.0.4.11:22", "winrm://h:5985", "root@h", "h:22", "ssh://u:p@h", "[::1]:22", "ssh://%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		tg, err := parseTarget(raw)
		if err != nil {
			if red := redactTarget(raw); strings.Contains(raw, ":secret@") && strings.Contains(red, "secret") {
				t.Fatalf("the refusal shows %q, with the password", red)
			}
			return
		}
		if err := (protocol.Check{ID: "fuzz", Targets: []protocol.CheckTarget{tg}}).Validate(); err != nil {
			t.Fatalf("parseTarget(%q) = %+v, which the protocol refuses: %v", raw, tg, err)
		}
	})
}
