package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
)

// The tests of this file send the inputs of issue 10 (hostile input that got through) to the
// real rte binary as a hostile app would, and check each is refused with a named reason
// before anything runs, and that nothing was lost: the work directory, its plugin, files
// beside it, the spool, and another job's private files.

// hostilePlaybooks writes the playbooks these tests run into a fresh ANSIBLE_PATH.
func hostilePlaybooks(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"sleep.yml": "- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.shell: \"sleep {{ seconds }} & sleep {{ seconds }}; wait\"\n",
		"quick.yml": "- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.debug:\n        msg: quick-ran\n",
		"env.yml": "- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.debug:\n" +
			"        msg: \"mark=[{{ lookup('env', 'OPERATOR_MARK') }}] other=[{{ lookup('env', 'OTHER_VAR') }}] token=[{{ lookup('env', 'RTE_TOKEN') }}]\"\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// waitFor reads until a message satisfies match, keeping the others for later.
func (a *rawApp) waitFor(what string, match func(protocol.Message) bool) protocol.Message {
	a.t.Helper()
	for i, m := range a.inbox {
		if match(m) {
			a.inbox = append(a.inbox[:i:i], a.inbox[i+1:]...)
			return m
		}
	}
	var kept []protocol.Message
	defer func() { a.inbox = append(a.inbox, kept...) }()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		m := readMsg(a.t, a.ws, time.Minute)
		if match(m) {
			return m
		}
		kept = append(kept, m)
	}
	a.t.Fatalf("no %s within a minute", what)
	return nil
}

// errorFor waits for the error message whose ref is id.
func (a *rawApp) errorFor(id string) *protocol.Error {
	a.t.Helper()
	return a.waitFor("error about "+id, func(m protocol.Message) bool {
		e, ok := m.(*protocol.Error)
		return ok && e.Ref == id
	}).(*protocol.Error)
}

// runToEnd reads and acks the job's records until its end, and returns its output text and
// end status. Records of other jobs are acked too.
func (a *rawApp) runToEnd(job string) (string, string) {
	a.t.Helper()
	var out strings.Builder
	for {
		m := a.waitFor("a record of "+job, func(m protocol.Message) bool {
			_, ok := m.(*protocol.Record)
			return ok
		}).(*protocol.Record)
		send(a.t, a.ws, &protocol.Ack{Job: m.Job, Seq: m.Seq})
		if m.Job != job {
			continue
		}
		switch m.Kind {
		case protocol.KindOutput:
			var d protocol.OutputData
			mustJSON(a.t, m.Data, &d)
			out.WriteString(d.Text)
		case protocol.KindEnd:
			var d protocol.EndData
			mustJSON(a.t, m.Data, &d)
			return out.String(), d.Status
		}
	}
}

func welcomeRaw(t *testing.T, rte *rteProc) *rawApp {
	t.Helper()
	a := &rawApp{t: t, ws: dialRTE(t, rte, testToken)}
	t.Cleanup(func() { a.ws.Close() })
	if _, ok := a.next().(*protocol.Hello); !ok {
		t.Fatal("the RTE did not say hello first")
	}
	send(t, a.ws, &protocol.Welcome{Protocol: protocol.Version, Node: "hostile", Approved: true})
	return a
}

// TestHostileJobStartRefused: job ids . and .., a limit that reads a file, an overflowing
// timeout and env names that move ansible's log or configuration, each sent to the real RTE
// while another job with a vault password runs. Each is refused with its reason, and the work
// directory, its plugin, files beside it and the running job's secret file are all still
// there; none of them reached the spool.
func TestHostileJobStartRefused(t *testing.T) {
	dir := t.TempDir()
	playbooks := hostilePlaybooks(t)
	testdata, _ := filepath.Abs("testdata")
	rte := startRTE(t, dir, freePort(t), "RTE_TOKEN="+testToken, "RTE_FILES=local",
		"ANSIBLE_PATH="+playbooks, "REPO_PATH="+filepath.Join(testdata, "inventory"))
	a := welcomeRaw(t, rte)

	work := filepath.Join(dir, "jobs") // RTE_WORK_PATH's default, relative to the RTE's directory
	beside := filepath.Join(dir, "beside.txt")
	inWork := filepath.Join(work, "operator-note.txt")
	for _, f := range []string{beside, inWork} {
		if err := os.WriteFile(f, []byte("keep me"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sealed, err := protocol.SealSecret(testToken, "keep-1", "vault-pw-keep")
	if err != nil {
		t.Fatal(err)
	}
	send(t, a.ws, &protocol.JobStart{Job: "keep-1", Playbook: "sleep.yml", Inventories: []string{"local.ini"},
		Extravars: json.RawMessage(`{"seconds":"308"}`), Secrets: map[string]string{"vault_password": sealed}})
	if _, ok := a.answer("keep-1").(*protocol.JobAccepted); !ok {
		t.Fatal("keep-1 not accepted")
	}
	a.waitFor("keep-1's start record", func(m protocol.Message) bool {
		r, ok := m.(*protocol.Record)
		return ok && r.Job == "keep-1" && r.Kind == protocol.KindStart
	})
	vaultFile := filepath.Join(work, "jobs", "keep-1", ".rte", "vault_password")
	if _, err := os.Stat(vaultFile); err != nil {
		t.Fatalf("keep-1's vault password file is not where this test looks: %v", err)
	}
	mark := len(rte.Log())

	leak := filepath.Join(dir, "leak.log")
	base := func(id string) *protocol.JobStart {
		return &protocol.JobStart{Job: id, Playbook: "quick.yml", Inventories: []string{"local.ini"}}
	}
	// Refused by the decoder: answered with an error naming the field, the socket kept.
	for _, c := range []struct {
		js   *protocol.JobStart
		want string
	}{
		{base(".."), `job: ".." is not 1 to 128 of [A-Za-z0-9._-], and not "." or ".."`},
		{base("."), `job: "." is not`},
		{func() *protocol.JobStart { js := base("limit-1"); js.Limit = "@/etc/passwd"; return js }(), `limit: "@/etc/passwd" contains @`},
		{func() *protocol.JobStart { js := base("limit-2"); js.Limit = "localhost,@/etc/hostname"; return js }(), `contains @`},
		{func() *protocol.JobStart { js := base("timeout-1"); js.TimeoutS = 10000000000; return js }(), "timeout_s: must be 0 (none) to 604800 seconds (7 days), got 10000000000"},
	} {
		send(t, a.ws, c.js)
		e := a.errorFor(c.js.Job)
		if e.Code != protocol.ErrInvalid || !strings.Contains(e.Message, c.want) {
			t.Errorf("job.start %q: error %+v, want code invalid naming %q", c.js.Job, e, c.want)
		}
	}
	// Refused by the jobs package: answered job.refused invalid, naming the variable.
	for _, c := range []struct {
		name, value, want string
	}{
		{"ANSIBLE_LOG_PATH", leak, "env.ANSIBLE_LOG_PATH: refused because it names a path on the RTE"},
		{"ANSIBLE_CONFIG", filepath.Join(dir, "evil.cfg"), "env.ANSIBLE_CONFIG: refused because it chooses the configuration file"},
		{"ANSIBLE_CALLBACK_PLUGINS", dir, "env.ANSIBLE_CALLBACK_PLUGINS"},
		{"ANSIBLE_ACTION_PLUGINS", dir, "env.ANSIBLE_ACTION_PLUGINS: refused because it chooses where plugins are loaded from"},
		{"PYTHONPATH", dir, "env.PYTHONPATH"},
	} {
		id := "env-" + strings.ToLower(strings.ReplaceAll(c.name, "_", "-"))
		js := base(id)
		js.Env = map[string]string{c.name: c.value}
		send(t, a.ws, js)
		ref, ok := a.answer(id).(*protocol.JobRefused)
		if !ok || ref.Code != protocol.RefusedInvalid || !strings.Contains(ref.Message, c.want) {
			t.Errorf("env %s: answer %+v, want job.refused invalid naming %q", c.name, ref, c.want)
		}
	}

	// The two smaller ones: a frame nested too deep is named so, and an unclean socket path is
	// not found rather than redirected.
	deep := `{"type":"job.cancel","job":"deep-1","x":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`
	if err := a.ws.WriteMessage(websocket.TextMessage, []byte(deep)); err != nil {
		t.Fatal(err)
	}
	if e := a.waitFor("the error about the deep frame", func(m protocol.Message) bool {
		e, ok := m.(*protocol.Error)
		return ok && e.Code == protocol.ErrBadJSON
	}).(*protocol.Error); !strings.Contains(e.Message, "nested deeper than 10000 levels") {
		t.Errorf("a frame nested 10001 deep: %+v, want bad_json naming the nesting", e)
	}
	noRedirect := &http.Client{Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, path := range []string{"//rte/v1/socket", "/rte/v1/../v1/socket", "//live"} {
		resp, err := noRedirect.Get(rte.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || resp.Header.Get("Location") != "" {
			t.Errorf("GET %s: %d Location %q, want 404 and no redirect", path, resp.StatusCode, resp.Header.Get("Location"))
		}
	}

	for what, p := range map[string]string{"the work directory": work, "the af_events plugin": filepath.Join(work, "plugins"),
		"a file in the work directory": inWork, "a file beside it": beside, "keep-1's vault password file": vaultFile,
		"the spool": filepath.Join(dir, "spool")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s (%s) is gone after the hostile starts: %v", what, p, err)
		}
	}
	if _, err := os.Stat(leak); err == nil {
		t.Errorf("ansible wrote %s although ANSIBLE_LOG_PATH was refused", leak)
	}
	spooled, _ := filepath.Glob(filepath.Join(dir, "spool", "*"))
	for _, f := range spooled {
		if b := filepath.Base(f); strings.HasSuffix(b, ".spool") && b != "keep-1.spool" {
			t.Errorf("the spool holds %s: a refused job reached it", b)
		}
	}
	if strings.Contains(rte.Log()[mark:], `"job accepted"`) {
		t.Errorf("the RTE accepted a hostile job:\n%s", testenv.Tail(rte.Log()[mark:], 3000))
	}

	// The running job was not disturbed: it is canceled and ends canceled, as any job would.
	send(t, a.ws, &protocol.JobCancel{Job: "keep-1"})
	if _, status := a.runToEnd("keep-1"); status != protocol.StatusCanceled {
		t.Fatalf("keep-1 ended %s, want canceled", status)
	}
	waitGone(t, "sleep 308")
	if _, err := os.Stat(filepath.Join(work, "plugins")); err != nil {
		t.Fatalf("the plugin directory is gone after keep-1 ended: %v", err)
	}
}

// TestHostileReplayedStart: a job.start replayed after the job ended and its end was
// acknowledged is refused already_ran before anything runs, also after the RTE restarts; a
// new id still runs. The operator's RTE_JOB_ENV_ALLOW decides which of the RTE's variables
// reach the job, and never its token.
func TestHostileReplayedStart(t *testing.T) {
	dir := t.TempDir()
	playbooks := hostilePlaybooks(t)
	testdata, _ := filepath.Abs("testdata")
	env := []string{"RTE_TOKEN=" + testToken, "RTE_FILES=local", "ANSIBLE_PATH=" + playbooks,
		"REPO_PATH=" + filepath.Join(testdata, "inventory"),
		"RTE_JOB_ENV_ALLOW=PATH,HOME,OPERATOR_*,RTE_*", "OPERATOR_MARK=from-the-operator", "OTHER_VAR=not-listed"}
	rte := startRTE(t, dir, freePort(t), env...)
	a := welcomeRaw(t, rte)

	send(t, a.ws, &protocol.JobStart{Job: "once-1", Playbook: "env.yml", Inventories: []string{"local.ini"}})
	if _, ok := a.answer("once-1").(*protocol.JobAccepted); !ok {
		t.Fatal("once-1 not accepted")
	}
	out, status := a.runToEnd("once-1")
	if status != protocol.StatusSuccess {
		t.Fatalf("once-1 ended %s, want success; output:\n%s", status, out)
	}
	if !strings.Contains(out, "mark=[from-the-operator] other=[] token=[]") {
		t.Fatalf("the job's environment is not what RTE_JOB_ENV_ALLOW says (OPERATOR_MARK in, OTHER_VAR and RTE_TOKEN out); output:\n%s", out)
	}

	replay := func(a *rawApp, rte *rteProc) {
		t.Helper()
		mark := len(rte.Log())
		send(t, a.ws, &protocol.JobStart{Job: "once-1", Playbook: "quick.yml", Inventories: []string{"local.ini"}})
		ref, ok := a.answer("once-1").(*protocol.JobRefused)
		if !ok || ref.Code != protocol.RefusedAlreadyRan || !strings.Contains(ref.Message, "job once-1 already ran on this RTE") {
			t.Fatalf("replayed once-1: %+v, want job.refused already_ran", ref)
		}
		if strings.Contains(rte.Log()[mark:], `"job accepted"`) {
			t.Fatalf("the replayed start was accepted:\n%s", testenv.Tail(rte.Log()[mark:], 2000))
		}
	}
	replay(a, rte)

	a.ws.Close()
	rte.Kill()
	rte = startRTE(t, dir, freePort(t), env...)
	a = welcomeRaw(t, rte)
	replay(a, rte)
	ledger, err := os.ReadFile(filepath.Join(dir, "jobs", "ran-jobs"))
	if err != nil || !strings.Contains(string(ledger), " once-1\n") {
		t.Fatalf("ran-jobs ledger %q (%v): want a line for once-1", ledger, err)
	}

	send(t, a.ws, &protocol.JobStart{Job: "once-2", Playbook: "quick.yml", Inventories: []string{"local.ini"}})
	if _, ok := a.answer("once-2").(*protocol.JobAccepted); !ok {
		t.Fatal("a new id was not accepted after a replay was refused")
	}
	if out, status := a.runToEnd("once-2"); status != protocol.StatusSuccess || !strings.Contains(out, "quick-ran") {
		t.Fatalf("once-2 ended %s, want success with its output; output:\n%s", status, out)
	}
}

// TestHostileJobIDTransferMode: in transfer mode, where job directories live in the shared
// cache under the RTE's own directory, job ids .. and . are refused before the cache is
// touched, and the RTE's directory in the cache is still there.
func TestHostileJobIDTransferMode(t *testing.T) {
	dir := t.TempDir()
	rte := startRTE(t, dir, freePort(t), "RTE_TOKEN="+testToken, "RTE_FILES=transfer")
	a := welcomeRaw(t, rte)
	owners, _ := filepath.Glob(filepath.Join(dir, "cache", "rtes", "*"))
	if len(owners) == 0 {
		t.Fatalf("no RTE directory in the cache at %s", filepath.Join(dir, "cache", "rtes"))
	}
	files := &protocol.JobFiles{Playbooks: protocol.BundleRef{Hash: "sha256:" + strings.Repeat("ab", 32), Size: 10}}
	for _, id := range []string{"..", "."} {
		send(t, a.ws, &protocol.JobStart{Job: id, Playbook: "site.yml", Files: files})
		if e := a.errorFor(id); e.Code != protocol.ErrInvalid || !strings.Contains(e.Message, `and not "." or ".."`) {
			t.Errorf("job %q in transfer mode: %+v, want invalid naming the rule", id, e)
		}
	}
	for _, p := range append(owners, filepath.Join(dir, "cache"), filepath.Join(dir, "jobs", "plugins")) {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s is gone after the hostile starts: %v", p, err)
		}
	}
}
