package api_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/rte-project/rte/internal/refapp/refapptest"

	"github.com/rte-project/rte/internal/refapp/api"
	"github.com/rte-project/rte/protocol"
)

const checkPath = "/api/v2/runners/%s/check_node_connections"

// TestCheckSchemaIsDocumented keeps the embedded schema and the one in docs/ the same file.
func TestCheckSchemaIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/schemas/api/" + api.CheckSchemaName)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(doc, api.CheckSchemaJSON) {
		t.Fatalf("docs/schemas/api/%s differs from the schema embedded in rte-app (internal/refapp/api/schemas): copy one over the other", api.CheckSchemaName)
	}
	api.CheckSchema() // panics if it does not compile
}

func TestCheckRefusesBadRequests(t *testing.T) {
	ta := refapptest.StartApp(t)
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
			status, body := ta.Call(t, http.MethodPost, fmt.Sprintf(checkPath, "r1"), tc.body)
			var e api.ErrorResponse
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
	if status, body := ta.Call(t, http.MethodPost, fmt.Sprintf(checkPath, "r1"), `{"targets":[`+strings.Repeat(" ", api.MaxCheckBody)+`]}`); status != http.StatusRequestEntityTooLarge {
		t.Errorf("a body over %d bytes: got %d %s, want 413", api.MaxCheckBody, status, body)
	}
	good := `{"targets":[{"host":"10.0.4.11"}]}`
	for _, tc := range []struct {
		name, runner, auth string
		status             int
		says               string
	}{
		{"no token", "r1", "", http.StatusUnauthorized, "missing Authorization"},
		{"unknown runner", "nope", "Bearer " + refapptest.AdminToken, http.StatusNotFound, `no runner named`},
		{"runner not connected", "r1", "Bearer " + refapptest.AdminToken, http.StatusConflict, "not connected"},
	} {
		status, body := ta.CallAs(t, http.MethodPost, fmt.Sprintf(checkPath, tc.runner), good, tc.auth)
		if status != tc.status || !strings.Contains(string(body), tc.says) {
			t.Errorf("%s: got %d %s, want %d saying %q", tc.name, status, body, tc.status, tc.says)
		}
	}
}

func TestCheckAnswersLikeBolt(t *testing.T) {
	ta := refapptest.StartApp(t)
	rte := refapptest.JoinFakeOutbound(t, ta, "out1")

	status, body := ta.Call(t, http.MethodPost, fmt.Sprintf(checkPath, "out1"),
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
	c := rte.LastCheck(t)
	if c.TimeoutMS != 1500 || c.Targets[0] != (protocol.CheckTarget{Name: "up1", Host: "up1", Port: 2222, User: "ansible", Transport: "ssh"}) ||
		c.Targets[1].Transport != "winrm" {
		t.Fatalf("the runner got %+v, want timeout_ms 1500, the name defaulting to the host and the transport to ssh", c)
	}

	status, body = ta.Call(t, http.MethodPost, fmt.Sprintf(checkPath, "out1"), `{"targets":[{"host":"up1"},{"host":"up2"}]}`)
	if status != http.StatusOK || !strings.HasPrefix(string(body), `{"status":"success"`) {
		t.Fatalf("all connected: got %d %s, want 200 with status success", status, body)
	}
	if c := rte.LastCheck(t); c.TimeoutMS != 0 {
		t.Fatalf("no timeout_ms in the request, the runner got %d, want 0 (its default)", c.TimeoutMS)
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
		req, err := api.ParseCheckRequest(body)
		if err != nil {
			var ref *api.Refusal
			if !errors.As(err, &ref) || ref.Status != http.StatusBadRequest || !strings.Contains(ref.Message, ": ") {
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
