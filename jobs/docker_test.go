package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/jobs"
	"github.com/rte-project/rte/protocol"
)

// These tests run jobs in containers of the real Docker engine, from the image
// ./scripts/image builds (rte:dev, with ansible-core). They skip when no engine answers.

const (
	dockerHost  = "unix:///var/run/docker.sock"
	dockerImage = "rte:dev"
)

// copyFiles is a Preparer that copies the testdata playbooks and inventory into the job
// directory, as transfer mode unpacks a bundle there: the container sees nothing else.
type copyFiles struct{}

func (copyFiles) Prepare(_ context.Context, js *protocol.JobStart, dir string) (jobs.Workspace, error) {
	for _, d := range []string{"playbooks", "repo"} {
		if err := os.CopyFS(filepath.Join(dir, d), os.DirFS(filepath.Join("testdata", d))); err != nil {
			return jobs.Workspace{}, err
		}
	}
	ws := jobs.Workspace{Dir: filepath.Join(dir, "playbooks"), Playbook: filepath.Join(dir, "playbooks", js.Playbook)}
	for _, inv := range js.Inventories {
		ws.Inventories = append(ws.Inventories, filepath.Join(dir, "repo", inv))
	}
	return ws, nil
}

// testEngine is a container engine the tests run jobs on: Docker at its usual socket, and
// Podman through the Docker-compatible service testenv.PodmanHost starts for this binary.
type testEngine struct {
	name   string // docker, podman: the subtest's name
	podman bool
}

var (
	dockerEngine = testEngine{name: "docker"}
	podmanEngine = testEngine{name: "podman", podman: true}
)

// host skips t when the engine is not there (Docker not answering, podman not installed).
func (en testEngine) host(t *testing.T) string {
	t.Helper()
	if en.podman {
		return testenv.PodmanHost(t, dockerImage, "rte")
	}
	return dockerHost
}

func (en testEngine) config(t *testing.T, name string) *jobs.ContainerConfig {
	return &jobs.ContainerConfig{Host: en.host(t), Image: dockerImage, Pull: jobs.PullNever, Network: "none", Name: name,
		NanoCPUs: 1e9, MemoryBytes: 512 << 20, Podman: en.podman}
}

// eachEngine runs fn once per engine, in parallel subtests named after it.
func eachEngine(t *testing.T, fn func(t *testing.T, en testEngine)) {
	t.Parallel()
	for _, en := range []testEngine{dockerEngine, podmanEngine} {
		t.Run(en.name, func(t *testing.T) {
			t.Parallel()
			fn(t, en)
		})
	}
}

func dockerConfig(name string) *jobs.ContainerConfig {
	return &jobs.ContainerConfig{Host: dockerHost, Image: dockerImage, Pull: jobs.PullNever, Network: "none", Name: name,
		NanoCPUs: 1e9, MemoryBytes: 512 << 20}
}

// requireEngine skips without the engine, makes sure it has the image, and returns a client for
// the checks.
func requireEngine(t *testing.T, en testEngine) *client.Client {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: this test runs jobs in real containers")
	}
	if !en.podman {
		// Docker first: Podman's copy of the image comes from Docker's store.
		requireDockerEngine(t)
	}
	cli := testenv.EngineClient(t, en.name, en.host(t))
	return cli
}

func requireDockerEngine(t *testing.T) {
	t.Helper()
	testenv.EngineClient(t, "Docker", dockerHost)
	testenv.RequireImage(t, dockerImage, "rte")
}

func newDockerEnv(t *testing.T, name string, mutate func(*jobs.Config)) (*testEnv, *client.Client) {
	t.Helper()
	return newEngineEnv(t, dockerEngine, name, mutate)
}

func newEngineEnv(t *testing.T, en testEngine, name string, mutate func(*jobs.Config)) (*testEnv, *client.Client) {
	t.Helper()
	cli := requireEngine(t, en)
	e := newTestEnv(t, func(cfg *jobs.Config) {
		cfg.Files = copyFiles{}
		cfg.Containers = en.config(t, name)
		if mutate != nil {
			mutate(cfg)
		}
	})
	return e, cli
}

// containersOf lists the containers labelled with the RTE name and job.
func containersOf(t *testing.T, cli *client.Client, name, job string) []string {
	t.Helper()
	f := make(client.Filters).Add("label", jobs.LabelName+"="+name)
	if job != "" {
		f.Add("label", jobs.LabelJob+"="+job)
	}
	res, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		t.Fatalf("list containers: %v", err)
	}
	var ids []string
	for _, c := range res.Items {
		ids = append(ids, c.ID)
	}
	return ids
}

func TestDockerSuccess(t *testing.T) {
	eachEngine(t, func(t *testing.T, en testEngine) {
		e, cli := newEngineEnv(t, en, "docker-test-ok", nil)
		js := jobStart("dok-1", "success.yml")
		js.Extravars = json.RawMessage(`{"greeting": "from-extravars-42"}`)
		e.start(t, js)
		recs := e.rec.waitEnd(t, "dok-1")
		e.rec.check(t, "dok-1", recs)
		wantSuccessYML(t, recs, dockerImage, "playbook_on_start", "runner_on_ok", "playbook_on_stats")
		e.wantDirGone(t, "dok-1")
		if ids := containersOf(t, cli, "docker-test-ok", "dok-1"); len(ids) != 0 {
			t.Errorf("containers left after the job: %v", ids)
		}
	})
}

func TestDockerFailedTask(t *testing.T) {
	eachEngine(t, func(t *testing.T, en testEngine) {
		e, _ := newEngineEnv(t, en, "docker-test-fail", nil)
		e.start(t, jobStart("dfail-1", "failed.yml"))
		recs := e.rec.waitEnd(t, "dfail-1")
		end := wantEnd(t, recs, protocol.StatusFailed, 2)
		if !strings.Contains(end.Message, "exited 2") {
			t.Errorf("end message %q, want exit 2", end.Message)
		}
		if out := outputText(t, recs); !strings.Contains(out, "boom on purpose") {
			t.Errorf("output lacks the failure message; output:\n%s", out)
		}
	})
}

func TestDockerSecretsMasked(t *testing.T) {
	eachEngine(t, func(t *testing.T, en testEngine) {
		const vaultPW, becomePW = `vault-pw-Ünïcode"42`, "become-pw-5c0ffee"
		e, _ := newEngineEnv(t, en, "docker-test-secret", nil)
		js := jobStart("dsecret-1", "secret.yml")
		js.Secrets = map[string]string{"vault_password": seal(t, "dsecret-1", vaultPW), "become_password": seal(t, "dsecret-1", becomePW)}
		ev, _ := json.Marshal(map[string]string{"leak": vaultPW, "leak_become": becomePW})
		js.Extravars = ev
		e.start(t, js)
		recs := e.rec.waitEnd(t, "dsecret-1")
		wantEnd(t, recs, protocol.StatusSuccess, 0)
		out := outputText(t, recs)
		if !strings.Contains(out, "vaulted=the-vaulted-value-7731") || !strings.Contains(out, "leak=********") {
			t.Errorf("output lacks the vaulted value or the masked secret; output:\n%s", out)
		}
		for _, r := range recs {
			for _, f := range []string{vaultPW, `vault-pw-Ünïcode\"42`, `vault-pw-\u00dcn\u00efcode\"42`, becomePW} {
				if strings.Contains(string(r.Data), f) {
					t.Errorf("record %d (%s) holds the secret %q", r.Seq, r.Kind, f)
				}
			}
		}
	})
}

// A running job's container, as docker inspect shows it, holds no secret (env, labels,
// command line), runs as no root user with no capabilities; cancel stops and removes it.
func TestDockerInspectShowsNoSecretAndCancelRemoves(t *testing.T) {
	eachEngine(t, func(t *testing.T, en testEngine) {
		const vaultPW = "vault-pw-inspect-9e1"
		e, cli := newEngineEnv(t, en, "docker-test-cancel", nil)
		js := jobStart("dcancel-1", "sleep.yml")
		js.Secrets = map[string]string{"vault_password": seal(t, "dcancel-1", vaultPW)}
		js.Extravars = json.RawMessage(`{"leak": "` + vaultPW + `"}`)
		e.start(t, js)
		e.rec.waitFor(t, "dcancel-1", "the sleep task", func(r []protocol.Record) bool {
			return strings.Contains(outputText(t, r), "sleep a while")
		})
		ids := containersOf(t, cli, "docker-test-cancel", "dcancel-1")
		if len(ids) != 1 {
			t.Fatalf("containers of the job = %v, want one", ids)
		}
		ins, err := cli.ContainerInspect(context.Background(), ids[0], client.ContainerInspectOptions{})
		if err != nil {
			t.Fatalf("inspect: %v", err)
		}
		if strings.Contains(string(ins.Raw), vaultPW) {
			t.Errorf("docker inspect shows the secret: %s", ins.Raw)
		}
		if strings.Contains(string(ins.Raw), testToken) || strings.Contains(string(ins.Raw), leakToken) {
			t.Errorf("docker inspect shows the RTE's token")
		}
		hc := ins.Container.HostConfig
		if u := ins.Container.Config.User; u == "" || u == "0" || strings.HasPrefix(u, "0:") || strings.HasPrefix(u, "root") {
			t.Errorf("container user %q, want a non-root uid", u)
		}
		// Podman shows ALL as the default capabilities it dropped, and the mount among the
		// container's mounts rather than in its host config.
		allDropped := len(hc.CapDrop) == 1 && hc.CapDrop[0] == "ALL"
		if en.podman {
			allDropped = len(hc.CapAdd) == 0 && slices.Contains(hc.CapDrop, "SETUID") && slices.Contains(hc.CapDrop, "NET_RAW") && slices.Contains(hc.CapDrop, "DAC_OVERRIDE")
		}
		if hc.Init == nil || !*hc.Init || !allDropped || !strings.Contains(strings.Join(hc.SecurityOpt, ","), "no-new-privileges") {
			t.Errorf("host config: init %v, cap drop %v, security %v; want init, ALL dropped, no-new-privileges", hc.Init, hc.CapDrop, hc.SecurityOpt)
		}
		if !en.podman && (len(hc.Mounts) != 1 || hc.Mounts[0].Source != filepath.Join(e.work, "dcancel-1")) {
			t.Errorf("mounts %+v, want only the job directory", hc.Mounts)
		}
		var binds []string
		for _, m := range ins.Container.Mounts {
			if m.Type == "bind" {
				binds = append(binds, m.Source)
			}
		}
		if len(binds) != 1 || binds[0] != filepath.Join(e.work, "dcancel-1") {
			t.Errorf("bind mounts %v, want only the job directory", binds)
		}
		if hc.NanoCPUs != 1e9 || hc.Memory != 512<<20 {
			t.Errorf("limits: cpus %d memory %d, want 1e9 and 512 MiB", hc.NanoCPUs, hc.Memory)
		}
		if !e.m.Cancel("dcancel-1") {
			t.Fatal("Cancel: job not running")
		}
		recs := e.rec.waitEnd(t, "dcancel-1")
		wantEnd(t, recs, protocol.StatusCanceled, anyCode)
		if ids := containersOf(t, cli, "docker-test-cancel", "dcancel-1"); len(ids) != 0 {
			t.Errorf("containers left after cancel: %v", ids)
		}
		e.wantDirGone(t, "dcancel-1")
	})
}

func TestDockerTimeout(t *testing.T) {
	eachEngine(t, func(t *testing.T, en testEngine) {
		e, cli := newEngineEnv(t, en, "docker-test-timeout", nil)
		js := jobStart("dtimeout-1", "sleep.yml")
		js.TimeoutS = 3
		e.start(t, js)
		recs := e.rec.waitEnd(t, "dtimeout-1")
		end := wantEnd(t, recs, protocol.StatusTimeout, anyCode)
		if !strings.Contains(end.Message, "timeout_s (3 s)") {
			t.Errorf("end message %q, want it to name timeout_s", end.Message)
		}
		if ids := containersOf(t, cli, "docker-test-timeout", "dtimeout-1"); len(ids) != 0 {
			t.Errorf("containers left after the timeout: %v", ids)
		}
	})
}

// The playbook tries to read the RTE's spool and token files and another job's directory: the
// container has none of them, even where the host's file modes would let anyone read.
func TestDockerJobCannotReadTheRTE(t *testing.T) {
	eachEngine(t, func(t *testing.T, en testEngine) {
		var work string
		e, _ := newEngineEnv(t, en, "docker-test-probe", func(cfg *jobs.Config) { work = cfg.WorkDir })
		rteFiles := t.TempDir()
		spool := filepath.Join(rteFiles, "spool", "segment-0001")
		token := filepath.Join(rteFiles, "token")
		other := filepath.Join(work, "other-job", "secret.txt")
		for _, p := range []string{spool, token, other} {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("must-not-be-read-31f"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		probes := []string{spool, token, other, filepath.Join(work, "other-job")}
		ev, _ := json.Marshal(map[string]any{"probes": probes})
		js := jobStart("dprobe-1", "probe.yml")
		js.Extravars = ev
		e.start(t, js)
		recs := e.rec.waitEnd(t, "dprobe-1")
		wantEnd(t, recs, protocol.StatusSuccess, 0)
		out := outputText(t, recs)
		for _, p := range probes {
			if !strings.Contains(out, "probe "+p+" read=False") {
				t.Errorf("output does not show the read of %s failing; output:\n%s", p, out)
			}
		}
		if strings.Contains(out, "must-not-be-read") || strings.Contains(out, "bXVzdC1ub3Qt") {
			t.Errorf("output holds a probed file's content:\n%s", out)
		}
	})
}

func TestDockerRefusesMissingImage(t *testing.T) {
	eachEngine(t, func(t *testing.T, en testEngine) {
		requireEngine(t, en)
		e := newTestEnv(t, func(cfg *jobs.Config) {
			cfg.Files = copyFiles{}
			cfg.Containers = en.config(t, "docker-test-noimage")
			cfg.Containers.Image = "rte-test-no-such-image:never"
		})
		err := e.m.Start(jobStart("dnoimage-1", "success.yml"))
		var r *jobs.Refusal
		if !errors.As(err, &r) || r.Code != protocol.RefusedFull || !strings.Contains(r.Message, "RTE_PULL=never") {
			t.Fatalf("Start = %v, want a refusal full naming RTE_PULL=never", err)
		}
		if err := e.m.Ready(context.Background()); err == nil {
			t.Error("Ready = nil, want the missing image")
		}
	})
}

func TestDockerRefusesEngineThatDoesNotAnswer(t *testing.T) {
	t.Parallel()
	requireAnsible(t)
	e := newTestEnv(t, func(cfg *jobs.Config) {
		cfg.Files = copyFiles{}
		cfg.Containers = dockerConfig("docker-test-noengine")
		cfg.Containers.Host = "unix://" + filepath.Join(t.TempDir(), "no-engine.sock")
	})
	err := e.m.Start(jobStart("dnoengine-1", "success.yml"))
	var r *jobs.Refusal
	if !errors.As(err, &r) || r.Code != protocol.RefusedFull || !strings.Contains(r.Message, "does not answer") {
		t.Fatalf("Start = %v, want a refusal full saying the engine does not answer", err)
	}
}

// What a killed RTE left: a running container labelled with its name is removed, one of another
// RTE name is left alone.
func TestRemoveContainersTouchesOnlyItsOwn(t *testing.T) {
	eachEngine(t, func(t *testing.T, en testEngine) {
		cli := requireEngine(t, en)
		ctx := context.Background()
		run := func(name, job string) string {
			c, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
				Config: &container.Config{Image: dockerImage, Entrypoint: []string{"sleep", "300"},
					Labels: map[string]string{jobs.LabelName: name, jobs.LabelJob: job}},
				// Podman's own default limits are more than this machine grants (the engine's
				// podmanUlimits); Docker takes them too.
				HostConfig: &container.HostConfig{Resources: container.Resources{Ulimits: []*container.Ulimit{
					{Name: "nofile", Soft: 1024, Hard: 1024}, {Name: "nproc", Soft: 1024, Hard: 1024}}}},
			})
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			t.Cleanup(func() { _, _ = cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true}) })
			if _, err := cli.ContainerStart(ctx, c.ID, client.ContainerStartOptions{}); err != nil {
				t.Fatalf("start: %v", err)
			}
			return c.ID
		}
		run("docker-test-left", "left-1")
		other := run("docker-test-left-other", "left-1")
		got, err := jobs.RemoveContainers(ctx, *en.config(t, "docker-test-left"))
		if err != nil || len(got) != 1 || got[0] != "left-1" {
			t.Fatalf("RemoveContainers = %v, %v; want [left-1]", got, err)
		}
		if ids := containersOf(t, cli, "docker-test-left", ""); len(ids) != 0 {
			t.Errorf("own containers left: %v", ids)
		}
		ins, err := cli.ContainerInspect(ctx, other, client.ContainerInspectOptions{})
		if err != nil || ins.Container.State == nil || !ins.Container.State.Running {
			t.Errorf("the other RTE's container was touched: %v", err)
		}
	})
}

// A playbook outside the job directory (RTE_FILES=local) cannot run in a container: the job
// ends error saying so, before any container is made.
func TestDockerRefusesPlaybookOutsideTheJobDirectory(t *testing.T) {
	t.Parallel()
	e, cli := newDockerEnv(t, "docker-test-local", func(cfg *jobs.Config) {
		cfg.Files = jobs.LocalFiles{AnsiblePath: mustAbs(t, "testdata/playbooks"), RepoPath: mustAbs(t, "testdata/repo")}
	})
	e.start(t, jobStart("dlocal-1", "success.yml"))
	recs := e.rec.waitEnd(t, "dlocal-1")
	end := wantEnd(t, recs, protocol.StatusError, -1)
	if !strings.Contains(end.Message, "RTE_FILES=transfer") {
		t.Errorf("end message %q, want it to name RTE_FILES=transfer", end.Message)
	}
	if ids := containersOf(t, cli, "docker-test-local", ""); len(ids) != 0 {
		t.Errorf("containers made: %v", ids)
	}
}

// TestMeasureEngineLatency is a measurement, not a check (docs/benchmarks.md): it runs the same
// tiny playbook several times with each engine, one job at a time, and logs the time from Start
// to the start record and to the end record. Run it with
// RTE_MEASURE=1 go test -count=1 -v -run TestMeasureEngineLatency ./jobs
func TestMeasureEngineLatency(t *testing.T) {
	if os.Getenv("RTE_MEASURE") == "" {
		t.Skip("a measurement: set RTE_MEASURE=1 to run it")
	}
	const runs = 5
	for _, engine := range []string{"process", "docker", "podman"} {
		mutate := func(cfg *jobs.Config) { cfg.Files = copyFiles{} }
		var e *testEnv
		switch engine {
		case "docker":
			e, _ = newEngineEnv(t, dockerEngine, "docker-test-measure", nil)
		case "podman":
			e, _ = newEngineEnv(t, podmanEngine, "podman-test-measure", nil)
		default:
			e = newTestEnv(t, mutate)
		}
		var toStart, toEnd []time.Duration
		for i := range runs {
			id := engine + "-measure-" + string(rune('a'+i))
			js := jobStart(id, "success.yml")
			js.Extravars = json.RawMessage(`{"greeting": "x"}`)
			t0 := time.Now()
			e.start(t, js)
			e.rec.waitFor(t, id, "the start record", func(r []protocol.Record) bool { return len(r) > 0 })
			toStart = append(toStart, time.Since(t0))
			recs := e.rec.waitEnd(t, id)
			toEnd = append(toEnd, time.Since(t0))
			wantEnd(t, recs, protocol.StatusSuccess, 0)
		}
		t.Logf("%s: Start to start record %v; Start to end record %v", engine, toStart, toEnd)
	}
}

// Drain waits for containers as for process groups: past its grace it stops the job's
// container, which ends abandoned and is removed.
func TestDockerDrainAbandons(t *testing.T) {
	eachEngine(t, func(t *testing.T, en testEngine) {
		e, cli := newEngineEnv(t, en, "docker-test-drain", nil)
		e.start(t, jobStart("ddrain-1", "sleep.yml"))
		e.rec.waitFor(t, "ddrain-1", "the sleep task", func(r []protocol.Record) bool {
			return strings.Contains(outputText(t, r), "sleep a while")
		})
		ctx, cancel := context.WithTimeout(context.Background(), safetyNet)
		defer cancel()
		if err := e.m.Drain(ctx, 500*time.Millisecond); err != nil {
			t.Fatalf("Drain: %v", err)
		}
		recs := e.rec.records("ddrain-1")
		wantEnd(t, recs, protocol.StatusAbandoned, anyCode)
		if ids := containersOf(t, cli, "docker-test-drain", "ddrain-1"); len(ids) != 0 {
			t.Errorf("containers left after the drain: %v", ids)
		}
	})
}

// PROCESS_MAX_BUFFER cuts a container's output exactly as a process group's.
func TestDockerOutputCutAtMaxOutputBytes(t *testing.T) {
	eachEngine(t, func(t *testing.T, en testEngine) {
		const limit = 4096
		e, _ := newEngineEnv(t, en, "docker-test-big", func(c *jobs.Config) { c.MaxOutputBytes = limit })
		e.start(t, jobStart("dbig-1", "big.yml"))
		recs := e.rec.waitEnd(t, "dbig-1")
		wantEnd(t, recs, protocol.StatusSuccess, 0)
		if out := outputText(t, recs); len(out) > limit || len(out) < limit/2 {
			t.Errorf("output is %d bytes, want at most %d (and most of it)", len(out), limit)
		}
		cuts := 0
		for _, l := range logMessages(t, recs) {
			if strings.Contains(l, "output cut at 4096 bytes") {
				cuts++
			}
		}
		if cuts != 1 || !strings.Contains(strings.Join(eventNames(t, recs), " "), "playbook_on_stats") {
			t.Errorf("%d log records say the output was cut (want 1), events %v", cuts, eventNames(t, recs))
		}
	})
}

// A job that goes over RTE_JOB_MEMORY fails, and its end says the container hit the limit.
func TestDockerMemoryLimit(t *testing.T) {
	eachEngine(t, func(t *testing.T, en testEngine) {
		e, _ := newEngineEnv(t, en, "docker-test-memory", func(c *jobs.Config) { c.Containers.MemoryBytes = 160 << 20 })
		e.start(t, jobStart("dmem-1", "memory.yml"))
		recs := e.rec.waitEnd(t, "dmem-1")
		end := wantEnd(t, recs, protocol.StatusFailed, anyCode)
		// Podman 4.3 reports OOMKilled only when the kernel killed the container's first
		// process, not ansible's child: the job fails with the child's SIGKILL (rc -9) in its
		// output, and the end cannot say why (docs/engines.md).
		if en.podman {
			if out := outputText(t, recs); !strings.Contains(out, `"rc": -9`) {
				t.Errorf("output lacks the killed task's rc -9:\n%s", out)
			}
			return
		}
		if !strings.Contains(end.Message, "memory limit (RTE_JOB_MEMORY)") {
			t.Errorf("end message %q, want it to name the memory limit; output:\n%s", end.Message, outputText(t, recs))
		}
	})
}

// The same playbook gives the same records with either engine: the same output text, the same
// events in the same order, the same end; only pids, uuids and times differ.
func TestDockerRecordsMatchProcessRecords(t *testing.T) {
	t.Parallel()
	run := func(e *testEnv, id string) []protocol.Record {
		js := jobStart(id, "success.yml")
		js.Extravars = json.RawMessage(`{"greeting": "same"}`)
		e.start(t, js)
		return e.rec.waitEnd(t, id)
	}
	copying := func(cfg *jobs.Config) { cfg.Files = copyFiles{} }
	inDocker, _ := newDockerEnv(t, "docker-test-same", nil)
	docker := run(inDocker, "same-1")
	process := run(newTestEnv(t, copying), "same-1") // the same id: the same job directory name
	if a, b := outputText(t, process), outputText(t, docker); a != b {
		t.Errorf("output differs:\nprocess:\n%s\ndocker:\n%s", a, b)
	}
	if a, b := strings.Join(eventNames(t, process), ","), strings.Join(eventNames(t, docker), ","); a != b {
		t.Errorf("events differ:\nprocess: %s\ndocker:  %s", a, b)
	}
	if a, b := endOf(t, process), endOf(t, docker); a != b {
		t.Errorf("ends differ: process %+v, docker %+v", a, b)
	}
	for _, recs := range [][]protocol.Record{process, docker} {
		if recs[0].Kind != protocol.KindStart || recs[len(recs)-1].Kind != protocol.KindEnd {
			t.Errorf("records %s, want start first and end last", dump(recs))
		}
	}
}

// A job may name an image RTE_IMAGES_ALLOW lets in, and runs in it; one it does not is refused
// invalid before any container is made, naming what the RTE runs.
func TestDockerJobImageAllowlist(t *testing.T) {
	eachEngine(t, func(t *testing.T, en testEngine) {
		const tag = "rte-ee-test:1"
		e, cli := newEngineEnv(t, en, "docker-test-images", func(cfg *jobs.Config) {
			cfg.Containers.Allow = []string{"rte-ee-test:*", "registry.example/ee-*:*"}
		})
		ctx := context.Background()
		if _, err := cli.ImageTag(ctx, client.ImageTagOptions{Source: dockerImage, Target: tag}); err != nil {
			t.Fatalf("tag %s as %s: %v", dockerImage, tag, err)
		}
		t.Cleanup(func() { _, _ = cli.ImageRemove(context.Background(), tag, client.ImageRemoveOptions{}) })
		if got := e.m.Images(); strings.Join(got, " ") != "rte:dev rte-ee-test:* registry.example/ee-*:*" {
			t.Errorf("Images = %q, want the default first, then the allowlist", got)
		}

		for _, c := range []struct{ image, want string }{
			{"rte-other:1", "image: rte-other:1 is not allowed on this RTE: it runs rte:dev, rte-ee-test:*, registry.example/ee-*:* (RTE_IMAGES_ALLOW)"},
			{"registry.example/ee-x/evil:1", "not allowed"}, // * does not cross /
			{"registry.example.evil/ee-1:1", "not allowed"},
		} {
			err := e.m.Start(&protocol.JobStart{Job: "dimg-refused", Playbook: "success.yml", Image: c.image})
			var r *jobs.Refusal
			if !errors.As(err, &r) || r.Code != protocol.RefusedInvalid || !strings.Contains(r.Message, c.want) {
				t.Errorf("Start with image %s = %v, want invalid containing %q", c.image, err, c.want)
			}
		}
		if ids := containersOf(t, cli, "docker-test-images", "dimg-refused"); len(ids) != 0 || e.rec.Has("dimg-refused") {
			t.Errorf("a refused job left containers %v or records", ids)
		}

		// Allowed, but not on the engine under RTE_PULL=never: refused full before anything starts.
		err := e.m.Start(&protocol.JobStart{Job: "dimg-missing", Playbook: "success.yml", Image: "rte-ee-test:missing"})
		var r *jobs.Refusal
		if !errors.As(err, &r) || r.Code != protocol.RefusedFull || !strings.Contains(r.Message, "rte-ee-test:missing (named by the job, allowed by RTE_IMAGES_ALLOW) is not on the container engine") {
			t.Errorf("Start with a missing allowed image = %v, want full naming it", err)
		}

		js := jobStart("dimg-1", "success.yml")
		js.Extravars = json.RawMessage(`{"greeting": "from-ee"}`)
		js.Image = tag
		e.start(t, js)
		// The start record comes once the container runs; ansible takes seconds to start, so the
		// container is still there to inspect (when it is not, the end below still counts).
		e.rec.waitFor(t, "dimg-1", "the start record", func(r []protocol.Record) bool { return len(r) > 0 })
		if ids := containersOf(t, cli, "docker-test-images", "dimg-1"); len(ids) == 1 {
			if ins, err := cli.ContainerInspect(ctx, ids[0], client.ContainerInspectOptions{}); err == nil && strings.TrimPrefix(ins.Container.Config.Image, "docker.io/library/") != tag {
				t.Errorf("the job's container runs %q, want %q", ins.Container.Config.Image, tag)
			}
		}
		recs := e.rec.waitEnd(t, "dimg-1")
		wantEnd(t, recs, protocol.StatusSuccess, 0)
		if start := startOf(t, recs); start.Image != tag {
			t.Errorf("start record %+v, want the image %s", start, tag)
		}
	})
}
