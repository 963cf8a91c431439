package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rte-project/rte/internal/refapp/api"
	"github.com/rte-project/rte/internal/refapp/cli"
	"github.com/rte-project/rte/internal/refapp/refapptest"
	"github.com/rte-project/rte/internal/refapp/server"
	"github.com/rte-project/rte/internal/refapp/sse"
	"github.com/rte-project/rte/protocol"
)

func TestAdminAPIRefusesWithoutTheToken(t *testing.T) {
	ta := refapptest.StartApp(t)
	routes := []struct{ method, path string }{
		{"GET", "/api/v2/runners"},
		{"POST", "/api/v2/runners/r1/approve"},
		{"POST", "/api/v2/runners/r1/reject"},
		{"POST", "/api/v2/jobs"},
		{"GET", "/api/v2/jobs"},
		{"GET", "/api/v2/jobs/x"},
		{"GET", "/api/v2/jobs/x/records"},
		{"GET", "/api/v2/jobs/x/stream"},
		{"POST", "/api/v2/jobs/x/cancel"},
		{"GET", "/api/v2/no/such/endpoint"},
	}
	auths := []struct{ name, header, want string }{
		{"missing", "", "missing Authorization"},
		{"not bearer", "Basic " + refapptest.AdminToken, "missing Authorization"},
		{"empty bearer", "Bearer ", "missing Authorization"},
		{"wrong", "Bearer " + strings.Repeat("x", len(refapptest.AdminToken)), "wrong admin token"},
		{"prefix of the token", "Bearer " + refapptest.AdminToken[:len(refapptest.AdminToken)-1], "wrong admin token"},
		{"token and more", "Bearer " + refapptest.AdminToken + "x", "wrong admin token"},
	}
	for _, rt := range routes {
		for _, a := range auths {
			status, body := ta.CallAs(t, rt.method, rt.path, "", a.header)
			var e api.ErrorResponse
			if status != http.StatusUnauthorized || json.Unmarshal(body, &e) != nil || !strings.Contains(e.Error, a.want) {
				t.Errorf("%s %s with %s token: got %d %s, want 401 with an error saying %q", rt.method, rt.path, a.name, status, body, a.want)
			}
		}
	}
	// The runner was neither approved again nor rejected by any of these.
	if status, body := ta.Call(t, "GET", "/api/v2/runners", ""); status != 200 || !strings.Contains(string(body), `"name":"r1"`) {
		t.Errorf("GET /api/v2/runners with the token: got %d %s, want 200 listing r1", status, body)
	}
}

func TestRegistrationNeedsNoAdminToken(t *testing.T) {
	ta := refapptest.StartApp(t)
	// A registration without a name is refused by package app (400), not by the admin guard.
	status, body := ta.CallAs(t, "POST", protocol.RegisterPath, `{"url":"https://127.0.0.1:9"}`, "")
	if status != http.StatusBadRequest || !strings.Contains(string(body), "name") {
		t.Errorf("POST %s without a token: got %d %s, want the registration's own 400 about the name", protocol.RegisterPath, status, body)
	}
}

func TestAdminAPIRefusesBadInput(t *testing.T) {
	ta := refapptest.StartApp(t)
	queued := ta.Submit(t, `{"runner":"r1","playbook":"site.yml"}`)
	cases := []struct {
		name, method, path, body string
		status                   int
		want                     string // the error must contain this
	}{
		{"not json", "POST", "/api/v2/jobs", `{"runner":`, 400, "body: not valid JSON"},
		{"empty body", "POST", "/api/v2/jobs", ``, 400, "body: empty"},
		{"array body", "POST", "/api/v2/jobs", `[1]`, 400, "body: must be a JSON object"},
		{"two objects", "POST", "/api/v2/jobs", `{"runner":"r1","playbook":"a.yml"}{}`, 400, "found more after it"},
		{"unknown field", "POST", "/api/v2/jobs", `{"runner":"r1","playbook":"a.yml","skiptags":["x"]}`, 400, "skiptags: unknown field"},
		{"unknown secret", "POST", "/api/v2/jobs", `{"runner":"r1","playbook":"a.yml","secrets":{"ssh_password":"x"}}`, 400, "ssh_password: unknown field"},
		{"runner missing", "POST", "/api/v2/jobs", `{"playbook":"a.yml"}`, 400, "runner: is required"},
		{"runner unknown", "POST", "/api/v2/jobs", `{"runner":"nope","playbook":"a.yml"}`, 400, `runner: no runner named "nope"`},
		{"playbook missing", "POST", "/api/v2/jobs", `{"runner":"r1"}`, 400, "playbook: is required"},
		{"playbook blank", "POST", "/api/v2/jobs", `{"runner":"r1","playbook":"  "}`, 400, "playbook: is required"},
		{"runner not a string", "POST", "/api/v2/jobs", `{"runner":1,"playbook":"a.yml"}`, 400, "runner: must be a JSON string"},
		{"check not a boolean", "POST", "/api/v2/jobs", `{"runner":"r1","playbook":"a.yml","check":"yes"}`, 400, "check: must be a JSON boolean"},
		{"forks not a number", "POST", "/api/v2/jobs", `{"runner":"r1","playbook":"a.yml","forks":"5"}`, 400, "forks: must be a JSON number"},
		{"tags not an array", "POST", "/api/v2/jobs", `{"runner":"r1","playbook":"a.yml","tags":"a"}`, 400, "tags: must be a JSON array"},
		{"extravars not an object", "POST", "/api/v2/jobs", `{"runner":"r1","playbook":"a.yml","extravars":[1]}`, 400, "extravars: must be a JSON object"},
		{"verbosity too high", "POST", "/api/v2/jobs", `{"runner":"r1","playbook":"a.yml","verbosity":7}`, 400, "verbosity: must be 0 to 6"},
		{"forks negative", "POST", "/api/v2/jobs", `{"runner":"r1","playbook":"a.yml","forks":-1}`, 400, "forks: must not be negative"},
		{"timeout negative", "POST", "/api/v2/jobs", `{"runner":"r1","playbook":"a.yml","timeout_s":-5}`, 400, "timeout_s: is -5"},
		{"timeout overflowing", "POST", "/api/v2/jobs", `{"runner":"r1","playbook":"a.yml","timeout_s":10000000000}`, 400, "timeout_s: is 10000000000; give the seconds the playbook may run, at most 604800 (7 days)"},
		{"limit reading a file", "POST", "/api/v2/jobs", `{"runner":"r1","playbook":"a.yml","limit":"@/etc/passwd"}`, 400, "contains @"},
		{"env bad name", "POST", "/api/v2/jobs", `{"runner":"r1","playbook":"a.yml","env":{"A-B":"1"}}`, 400, `env: "A-B" is not a variable name`},
		{"empty inventory", "POST", "/api/v2/jobs", `{"runner":"r1","playbook":"a.yml","inventories":[""]}`, 400, "inventories[0]: is empty"},
		{"tag with comma", "POST", "/api/v2/jobs", `{"runner":"r1","playbook":"a.yml","skip_tags":["a,b"]}`, 400, "skip_tags[0]:"},
		{"too large", "POST", "/api/v2/jobs", `{"runner":"r1","playbook":"a.yml","extravars":{"x":"` + strings.Repeat("x", api.MaxJobBody) + `"}}`, 413, "larger than"},

		{"jobs bad state", "GET", "/api/v2/jobs?state=done", "", 400, `state: "done" is not queued`},
		{"jobs bad limit", "GET", "/api/v2/jobs?limit=0", "", 400, "limit: \"0\" is not a whole number from 1"},
		{"records bad after", "GET", "/api/v2/jobs/" + queued.ID + "/records?after=-1", "", 400, "after:"},
		{"records bad limit", "GET", "/api/v2/jobs/" + queued.ID + "/records?limit=x", "", 400, "limit:"},
		{"stream bad after", "GET", "/api/v2/jobs/" + queued.ID + "/stream?after=abc", "", 400, "after:"},

		{"approve bad body", "POST", "/api/v2/runners/r1/approve", `{"fingerprint":"x"}`, 400, "fingerprint: unknown field"},
		{"approve wrong fingerprint", "POST", "/api/v2/runners/r1/approve", `{"certificate_fingerprint":"abcd-ef12"}`, 409, "no certificate waiting"},
		{"approve unknown", "POST", "/api/v2/runners/nope/approve", "", 404, `no runner named "nope"`},
		{"approve wrong sha256", "POST", "/api/v2/runners/r1/approve", `{"certificate_sha256":"0000000000000000000000000000000000000000000000000000000000000000"}`, 409, "no certificate is waiting for approval"},
		{"approve short sha256", "POST", "/api/v2/runners/r1/approve", `{"certificate_sha256":"abcd-ef12"}`, 409, "is not a full SHA-256"},
		{"clear waiting bad body", "POST", "/api/v2/runners/clear-waiting", `{"why":"x"}`, 400, "why: unknown field"},
		{"reject unknown", "POST", "/api/v2/runners/nope/reject", "", 404, `no runner named "nope"`},
		{"job unknown", "GET", "/api/v2/jobs/nope", "", 404, `no job "nope"`},
		{"records unknown", "GET", "/api/v2/jobs/nope/records", "", 404, `no job "nope"`},
		{"stream unknown", "GET", "/api/v2/jobs/nope/stream", "", 404, `no job "nope"`},
		{"cancel unknown", "POST", "/api/v2/jobs/nope/cancel", "", 404, `no job "nope"`},
		{"no endpoint", "GET", "/api/v2/nothing", "", 404, "no endpoint GET /api/v2/nothing"},
		{"wrong method", "DELETE", "/api/v2/jobs/" + queued.ID, "", 404, "no endpoint DELETE"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body := ta.Call(t, tc.method, tc.path, tc.body)
			var e api.ErrorResponse
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("%s %s: the body is not a JSON error: %s", tc.method, tc.path, body)
			}
			if status != tc.status || !strings.Contains(e.Error, tc.want) {
				t.Errorf("%s %s %.200s:\ngot  %d %q\nwant %d with %q", tc.method, tc.path, tc.body, status, e.Error, tc.status, tc.want)
			}
		})
	}
	// None of the refused submissions queued a job.
	status, body := ta.Call(t, "GET", "/api/v2/jobs", "")
	var list api.JobsResponse
	if status != 200 || json.Unmarshal(body, &list) != nil || len(list.Jobs) != 1 || list.Jobs[0].ID != queued.ID {
		t.Errorf("GET /api/v2/jobs: got %d %s, want only job %s", status, body, queued.ID)
	}
}

func TestJobLifecycleOverTheAPI(t *testing.T) {
	ta := refapptest.StartApp(t)
	j := ta.Submit(t, `{"runner":"r1","playbook":"site.yml","inventories":["hosts.yml"],"extravars":{"a":1},
		"tags":["t1"],"check":true,"verbosity":2,"forks":3,"timeout_s":60,"env":{"K":"v"},
		"secrets":{"vault_password":"vault-secret-must-not-leak","become_password":"become-secret-must-not-leak"}}`)
	if j.ID == "" || j.Runner != "r1" || j.State != "queued" || j.Playbook != "site.yml" || !j.Check || j.Verbosity != 2 || j.Forks != 3 || j.TimeoutS != 60 {
		t.Errorf("submitted job = %+v, want the fields given, queued on r1", j)
	}
	if strings.Join(j.Secrets, ",") != "become_password,vault_password" {
		t.Errorf("job secrets = %v, want the names become_password and vault_password", j.Secrets)
	}
	for _, path := range []string{"/api/v2/jobs/" + j.ID, "/api/v2/jobs", "/api/v2/jobs?runner=r1&state=queued,running&limit=5"} {
		status, body := ta.Call(t, "GET", path, "")
		if status != 200 || !strings.Contains(string(body), j.ID) {
			t.Errorf("GET %s: got %d %s, want 200 with job %s", path, status, body, j.ID)
		}
		if strings.Contains(string(body), "must-not-leak") {
			t.Errorf("GET %s shows a secret's value: %s", path, body)
		}
	}
	status, body := ta.Call(t, "GET", "/api/v2/jobs?state=ended", "")
	if status != 200 || strings.Contains(string(body), j.ID) {
		t.Errorf("GET /api/v2/jobs?state=ended: got %d %s, want 200 without the queued job", status, body)
	}

	status, body = ta.Call(t, "POST", "/api/v2/jobs/"+j.ID+"/cancel", "")
	var canceled api.JobView
	if status != http.StatusAccepted || json.Unmarshal(body, &canceled) != nil || canceled.State != "ended" || canceled.Status != protocol.StatusCanceled {
		t.Errorf("cancel a queued job: got %d %s, want 202 with the job ended canceled", status, body)
	}
	status, body = ta.Call(t, "POST", "/api/v2/jobs/"+j.ID+"/cancel", "")
	if status != http.StatusConflict || !strings.Contains(string(body), "already ended") {
		t.Errorf("cancel an ended job: got %d %s, want 409 saying it has already ended", status, body)
	}
	if strings.Contains(ta.Logs.String(), "must-not-leak") {
		t.Errorf("a secret's value reached the log:\n%s", ta.Logs.String())
	}
}

func TestRunnersShowFingerprintsNotTokens(t *testing.T) {
	ta := refapptest.StartApp(t)
	status, body := ta.Call(t, "GET", "/api/v2/runners", "")
	var list api.RunnersResponse
	if status != 200 || json.Unmarshal(body, &list) != nil || len(list.Runners) != 1 {
		t.Fatalf("GET /api/v2/runners: got %d %s, want one runner", status, body)
	}
	r := list.Runners[0]
	if r.Name != "r1" || r.State != "approved" || r.TokenFingerprint != protocol.TokenFingerprint(refapptest.RunnerToken) || r.Connected {
		t.Errorf("runner = %+v, want r1 approved, not connected, with its token's fingerprint", r)
	}
	if strings.Contains(string(body), refapptest.RunnerToken) {
		t.Errorf("the runner list shows the runner's token: %s", body)
	}
}

// TestStreamFollowsRecordsAndResumes plays the runner by storing records while a client reads
// the stream: every record arrives once, in order, the stream ends with the job after the end
// record, and a stream opened with Last-Event-ID starts after that seq.
func TestStreamFollowsRecordsAndResumes(t *testing.T) {
	// The server's read timeout must not cut a stream that outlives it.
	saved := server.ReadTimeout
	server.ReadTimeout = 300 * time.Millisecond
	t.Cleanup(func() { server.ReadTimeout = saved })
	ta := refapptest.StartApp(t)
	j := ta.Submit(t, `{"runner":"r1","playbook":"site.yml"}`)
	ta.StoreRecords(t, j.ID,
		refapptest.Record(t, 1, protocol.KindStart, protocol.StartData{PID: 42, Instance: "rte-host", Playbook: "site.yml"}),
		refapptest.Record(t, 2, protocol.KindOutput, protocol.OutputData{Text: "PLAY [demo]\n"}))

	c, err := cli.NewClient(ta.URL, refapptest.AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.OpenStream(ctx, j.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := sse.NewReader(resp.Body)
	next := func() sse.Event {
		t.Helper()
		ev, err := r.Next()
		if err != nil {
			t.Fatalf("read the stream: %v", err)
		}
		return ev
	}
	for want := int64(1); want <= 2; want++ {
		if ev := next(); ev.Name != api.EventRecord || ev.ID != jsonInt(want) {
			t.Fatalf("event = %s id %s, want record %d", ev.Name, ev.ID, want)
		}
	}
	// Past the server's read timeout, the stream is still open and still delivers.
	time.Sleep(2 * server.ReadTimeout)
	ta.StoreRecords(t, j.ID,
		refapptest.Record(t, 3, protocol.KindOutput, protocol.OutputData{Text: "ok: [localhost]\n"}),
		refapptest.Record(t, 4, protocol.KindEnd, protocol.EndData{Status: protocol.StatusSuccess}))
	for want := int64(3); want <= 4; want++ {
		if ev := next(); ev.Name != api.EventRecord || ev.ID != jsonInt(want) {
			t.Fatalf("event = %s id %s, want record %d", ev.Name, ev.ID, want)
		}
	}
	if ev := next(); ev.Name != api.EventJob || !strings.Contains(string(ev.Data), j.ID) {
		t.Fatalf("event after the end record = %s %s, want the job", ev.Name, ev.Data)
	}
	if ev, err := r.Next(); err == nil {
		t.Fatalf("the stream goes on after the job event: %s %s", ev.Name, ev.Data)
	}

	// Resuming after record 2 gives 3, 4 and the job.
	resp2, err := c.OpenStream(ctx, j.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	var got []string
	sc := bufio.NewScanner(resp2.Body)
	for sc.Scan() {
		if id, ok := strings.CutPrefix(sc.Text(), "id: "); ok {
			got = append(got, id)
		}
		if sc.Text() == "event: job" {
			got = append(got, "job")
		}
	}
	if strings.Join(got, ",") != "3,4,job" {
		t.Errorf("resumed stream gave %v, want 3,4,job", got)
	}
}

func jsonInt(n int64) string { b, _ := json.Marshal(n); return string(b) }

// TestStreamOfAJobTheAppEnded covers a job that never reached a runner: its stream has no
// records and ends with the job as soon as the job has ended.
func TestStreamOfAJobTheAppEnded(t *testing.T) {
	ta := refapptest.StartApp(t)
	j := ta.Submit(t, `{"runner":"r1","playbook":"site.yml"}`)
	c, err := cli.NewClient(ta.URL, refapptest.AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.OpenStream(ctx, j.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if status, body := ta.Call(t, "POST", "/api/v2/jobs/"+j.ID+"/cancel", ""); status != http.StatusAccepted {
		t.Fatalf("cancel: got %d %s, want 202", status, body)
	}
	ev, err := sse.NewReader(resp.Body).Next()
	if err != nil {
		t.Fatal(err)
	}
	var got api.JobView
	if ev.Name != api.EventJob || json.Unmarshal(ev.Data, &got) != nil || got.Status != protocol.StatusCanceled {
		t.Errorf("first event = %s %s, want the job, ended canceled", ev.Name, ev.Data)
	}
}
