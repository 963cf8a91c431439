package deploy_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rte-project/rte/protocol"
)

// The compose project's tests drive docker compose exactly as docs/install-compose.md does,
// with compose/.env.example as the environment file, against the images scripts/image builds.

const (
	composeFile = "../compose/compose.yaml"
	exampleEnv  = "../compose/.env.example"
	testFile    = "testdata/compose.test.yaml" // adds the slow playbook for the kill test
)

// needDocker skips the test, saying which test could not run and why, when no Docker engine
// answers or no docker compose v2+ can be had; it installs the compose plugin with
// scripts/compose when only that is missing.
func needDocker(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skipf("%s not run: -short skips the Docker tests (they build images)", t.Name())
	}
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skipf("%s not run: no docker command on PATH, so no Docker engine to run the images in", t.Name())
	}
	if out, err := exec.Command("docker", "version", "--format", "{{.Server.Version}}").CombinedOutput(); err != nil {
		t.Skipf("%s not run: no Docker engine answers (docker version: %v: %s)", t.Name(), err, bytes.TrimSpace(out))
	}
	composeOnce.Do(func() {
		out, err := exec.Command("../scripts/compose").CombinedOutput()
		if err != nil {
			composeErr = fmt.Errorf("scripts/compose: %v\n%s", err, out)
		}
	})
	if composeErr != nil {
		t.Fatalf("docker compose v2+ could not be installed: %v", composeErr)
	}
}

var (
	composeOnce sync.Once
	composeErr  error
	imagesMu    sync.Mutex
	imagesErr   = map[string]error{} // by the targets asked for; present once built or failed
)

// buildImages runs scripts/image once per test binary for the targets given (none: all of them,
// rte:dev, rte-app:dev, rte-host:dev and rte-postgres:dev).
func buildImages(t *testing.T, targets ...string) {
	t.Helper()
	imagesMu.Lock()
	defer imagesMu.Unlock()
	key := strings.Join(targets, " ")
	err, done := imagesErr[key]
	if !done {
		start := time.Now()
		out, runErr := exec.Command("../scripts/image", targets...).CombinedOutput()
		if runErr != nil {
			err = fmt.Errorf("scripts/image %s: %v\n%s", key, runErr, out)
		} else {
			t.Logf("scripts/image %s took %s:\n%s", key, time.Since(start).Round(time.Second), bytes.TrimSpace(out))
		}
		imagesErr[key] = err
	}
	if err != nil {
		t.Fatal(err)
	}
}

// project is one compose project under a unique name, removed with its volumes at cleanup.
type project struct {
	t        *testing.T
	name     string
	files    []string
	profiles []string // given to every compose command, so down removes their services too
	appAddr  string   // host:port of the app's published port, once asked
}

func newProject(t *testing.T, files ...string) *project {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	p := &project{t: t, name: "rtetest" + hex.EncodeToString(b), files: append([]string{composeFile}, files...)}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := p.compose(context.Background(), "logs", "--no-color", "--tail", "80")
			t.Logf("compose logs of %s:\n%s", p.name, out)
		}
		if out, err := p.compose(context.Background(), "down", "-v", "--remove-orphans", "--timeout", "5"); err != nil {
			t.Errorf("compose down -v: %v\n%s", err, out)
		}
	})
	return p
}

// compose runs docker compose for the project and returns its combined output.
func (p *project) compose(ctx context.Context, args ...string) (string, error) {
	full := []string{"compose", "-p", p.name}
	for _, f := range p.files {
		full = append(full, "-f", f)
	}
	full = append(full, "--env-file", exampleEnv)
	for _, pr := range p.profiles {
		full = append(full, "--profile", pr)
	}
	full = append(full, args...)
	cmd := exec.CommandContext(ctx, "docker", full...)
	// The example's values, but the apps published on ports Docker picks, so that projects
	// running at once do not collide (appAddr asks which).
	cmd.Env = append(os.Environ(), "APP_PORT=0", "APP_B_PORT=0")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (p *project) mustCompose(timeout time.Duration, args ...string) string {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := p.compose(ctx, args...)
	if err != nil {
		p.t.Fatalf("docker compose %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// leftovers lists what Docker still holds of the project: containers, volumes, networks.
func (p *project) leftovers() []string {
	p.t.Helper()
	label := "label=com.docker.compose.project=" + p.name
	var left []string
	for _, kind := range [][]string{
		{"ps", "-a", "--filter", label, "--format", "container {{.Names}}"},
		{"volume", "ls", "--filter", label, "--format", "volume {{.Name}}"},
		{"network", "ls", "--filter", label, "--format", "network {{.Name}}"},
	} {
		out, err := exec.Command("docker", kind...).CombinedOutput()
		if err != nil {
			p.t.Fatalf("docker %s: %v\n%s", strings.Join(kind, " "), err, out)
		}
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if l != "" {
				left = append(left, l)
			}
		}
	}
	return left
}

// adminToken is the example environment file's APP_ADMIN_TOKEN.
func adminToken(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(exampleEnv)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^APP_ADMIN_TOKEN=(\S+)$`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("%s sets no APP_ADMIN_TOKEN", exampleEnv)
	}
	return string(m[1])
}

// api calls the app's admin API on its published port and decodes the answer into out.
func (p *project) api(method, path string, body, out any) {
	p.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	if p.appAddr == "" {
		p.appAddr = strings.TrimSpace(p.mustCompose(time.Minute, "port", "app", "8080"))
	}
	req, err := http.NewRequest(method, "http://"+p.appAddr+path, rd)
	if err != nil {
		p.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken(p.t))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		p.t.Fatalf("%s %s: %s: %s", method, path, resp.Status, data)
	}
	if err := json.Unmarshal(data, out); err != nil {
		p.t.Fatalf("%s %s: %v in %s", method, path, err, data)
	}
}

type runner struct {
	Name        string `json:"name"`
	State       string `json:"state"`
	Connected   bool   `json:"connected"`
	Node        string `json:"node"` // the app node holding its socket
	Certificate *struct {
		SHA256 string `json:"sha256"`
	} `json:"certificate"`
	PendingCertificate *struct {
		SHA256 string `json:"sha256"`
	} `json:"pending_certificate"`
}

func (p *project) runner(name string) runner {
	p.t.Helper()
	var rs struct {
		Runners []runner `json:"runners"`
	}
	p.api("GET", "/api/v2/runners", nil, &rs)
	for _, r := range rs.Runners {
		if r.Name == name {
			return r
		}
	}
	p.t.Fatalf("the app has no runner %s: %+v", name, rs.Runners)
	return runner{}
}

type job struct {
	ID      string `json:"id"`
	State   string `json:"state"`
	Status  string `json:"status"`
	LastSeq int64  `json:"last_seq"`
}

func (p *project) jobs() []job {
	p.t.Helper()
	var js struct {
		Jobs []job `json:"jobs"`
	}
	p.api("GET", "/api/v2/jobs", nil, &js)
	return js.Jobs
}

func (p *project) job(id string) job {
	p.t.Helper()
	var j job
	p.api("GET", "/api/v2/jobs/"+id, nil, &j)
	return j
}

// story is what the app stored of a job: its records in order, and their output text joined.
type story struct {
	Records []protocol.Record
	Output  string
}

// story reads every record the app stored for the job, page by page.
func (p *project) story(id string) story {
	p.t.Helper()
	var s story
	var text strings.Builder
	for {
		var page struct {
			Records []protocol.Record `json:"records"`
		}
		after := int64(0)
		if n := len(s.Records); n > 0 {
			after = s.Records[n-1].Seq
		}
		p.api("GET", fmt.Sprintf("/api/v2/jobs/%s/records?after=%d", id, after), nil, &page)
		if len(page.Records) == 0 {
			s.Output = text.String()
			return s
		}
		for _, r := range page.Records {
			if r.Kind == protocol.KindOutput {
				var d protocol.OutputData
				if err := json.Unmarshal(r.Data, &d); err != nil {
					p.t.Fatalf("job %s output record %d: %v", id, r.Seq, err)
				}
				text.WriteString(d.Text)
			}
		}
		s.Records = append(s.Records, page.Records...)
	}
}

// storyUntil reads the job's records until their output holds text, for at most 3 minutes.
func (p *project) storyUntil(id, text string) story {
	p.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		s := p.story(id)
		if strings.Contains(s.Output, text) {
			return s
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("no %s in job %s's output after 3 minutes; %d records, output:\n%s", text, id, len(s.Records), s.Output)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkRecords checks the job's records as the protocol promises them: seq 1 to n, each
// once, start first, end last and only last. It returns the end's data.
func checkRecords(t *testing.T, recs []protocol.Record) protocol.EndData {
	t.Helper()
	if len(recs) < 2 {
		t.Fatalf("%d records, want at least start and end", len(recs))
	}
	for i, r := range recs {
		if r.Seq != int64(i+1) {
			t.Fatalf("record %d has seq %d, want %d: a record is missing or stored twice", i, r.Seq, i+1)
		}
		if r.Kind == protocol.KindEnd && i != len(recs)-1 {
			t.Fatalf("an end record at seq %d of %d", r.Seq, len(recs))
		}
	}
	if recs[0].Kind != protocol.KindStart {
		t.Errorf("seq 1 is %s, want start", recs[0].Kind)
	}
	last := recs[len(recs)-1]
	if last.Kind != protocol.KindEnd {
		t.Fatalf("the last record (seq %d) is %s, want end", last.Seq, last.Kind)
	}
	var end protocol.EndData
	if err := json.Unmarshal(last.Data, &end); err != nil {
		t.Fatalf("end record %s: %v", last.Data, err)
	}
	return end
}

// TestComposeProject is the compose project as docs/install-compose.md runs it: up healthy with
// nobody approving anything, the example job on the managed host over ssh, a restart of the RTE
// keeping its certificate and pin, and down -v leaving nothing behind.
func TestComposeProject(t *testing.T) {
	needDocker(t)
	buildImages(t)
	p := newProject(t)

	start := time.Now()
	p.mustCompose(10*time.Minute, "up", "-d", "--wait")
	t.Logf("up -d --wait: %s", time.Since(start).Round(100*time.Millisecond))

	run := func() string {
		t.Helper()
		start := time.Now()
		out := p.mustCompose(5*time.Minute, "exec", "-T", "app",
			"rte-app", "run", "--runner", "rte01", "--playbook", "site.yml", "--inventory", "hosts.yml")
		t.Logf("the example job: %s", time.Since(start).Round(100*time.Millisecond))
		if !regexp.MustCompile(`host\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=0`).MatchString(out) {
			t.Fatalf("the example job's output has no clean recap for host:\n%s", out)
		}
		return out
	}
	run()
	pinned := p.runner("rte01")
	if pinned.State != "approved" || pinned.Certificate == nil || pinned.PendingCertificate != nil {
		t.Fatalf("runner rte01 is %+v, want approved with a pinned certificate and none pending", pinned)
	}
	js := p.jobs()
	if len(js) != 1 {
		t.Fatalf("%d jobs, want the one run: %+v", len(js), js)
	}
	st := p.story(js[0].ID)
	if end := checkRecords(t, st.Records); end.Status != protocol.StatusSuccess {
		t.Fatalf("the example job ended %+v, want success", end)
	}
	if !strings.Contains(st.Output, "PLAY RECAP") {
		t.Errorf("the stored output has no PLAY RECAP:\n%s", st.Output)
	}

	start = time.Now()
	p.mustCompose(2*time.Minute, "restart", "rte")
	p.mustCompose(5*time.Minute, "up", "-d", "--wait")
	t.Logf("restart rte until healthy: %s", time.Since(start).Round(100*time.Millisecond))
	run()
	after := p.runner("rte01")
	if after.Certificate == nil || after.Certificate.SHA256 != pinned.Certificate.SHA256 || after.State != "approved" {
		t.Fatalf("after the restart runner rte01 is %+v, want approved with the same pin %s", after, pinned.Certificate.SHA256)
	}

	start = time.Now()
	p.mustCompose(3*time.Minute, "down", "-v", "--timeout", "30")
	t.Logf("down -v: %s", time.Since(start).Round(100*time.Millisecond))
	if left := p.leftovers(); len(left) > 0 {
		t.Fatalf("down -v left %v", left)
	}
}

// TestComposeKillRTEMidJob kills the RTE's container (SIGKILL, docker kill) while a job runs on
// the managed host and starts it again: the job ends abandoned, as docs/jobs.md says of a job
// that was running when its RTE restarted, and every record reached the app exactly once, the
// ones stored before the kill unchanged.
func TestComposeKillRTEMidJob(t *testing.T) {
	needDocker(t)
	buildImages(t)
	p := newProject(t, testFile)
	p.mustCompose(10*time.Minute, "up", "-d", "--wait")

	var j job
	p.api("POST", "/api/v2/jobs", map[string]any{
		"runner": "rte01", "playbook": "slow.yml", "inventories": []string{"hosts.yml"},
	}, &j)
	// A few items stored, so the kill lands mid-stream.
	before := p.storyUntil(j.ID, "(item=3)")

	p.mustCompose(time.Minute, "kill", "-s", "SIGKILL", "rte")
	p.mustCompose(5*time.Minute, "up", "-d", "--wait", "rte")

	deadline := time.Now().Add(3 * time.Minute)
	for j = p.job(j.ID); j.State != "ended"; j = p.job(j.ID) {
		if time.Now().After(deadline) {
			t.Fatalf("the job is %+v 3 minutes after the RTE came back, want ended", j)
		}
		time.Sleep(500 * time.Millisecond)
	}
	after := p.story(j.ID)
	recs := after.Records
	end := checkRecords(t, recs)
	if end.Status != protocol.StatusAbandoned {
		t.Fatalf("the job ended %+v, want abandoned (running when its RTE restarted)", end)
	}
	if len(recs) < len(before.Records) {
		t.Fatalf("%d records after the kill, %d before: records were lost", len(recs), len(before.Records))
	}
	for i, r := range before.Records {
		if recs[i].Seq != r.Seq || recs[i].Kind != r.Kind || !bytes.Equal(recs[i].Data, r.Data) {
			t.Fatalf("record %d changed across the kill: %s %s, then %s %s", r.Seq, r.Kind, r.Data, recs[i].Kind, recs[i].Data)
		}
	}
	items := regexp.MustCompile(`\(item=(\d+)\)`).FindAllStringSubmatch(after.Output, -1)
	seen := map[string]int{}
	for _, m := range items {
		seen[m[1]]++
		if seen[m[1]] > 1 {
			t.Fatalf("item %s is in the stored output %d times, want once", m[1], seen[m[1]])
		}
	}
	if len(seen) < 3 || len(seen) >= 300 {
		t.Fatalf("%d items in the stored output, want some but not all 300 (the kill was mid-job)", len(seen))
	}
	t.Logf("%d records, %d items stored once each, then %s", len(recs), len(seen), end.Status)
}
