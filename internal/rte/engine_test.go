package rte_test

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/jobs"
	"github.com/rte-project/rte/jobs/spool"
	"github.com/rte-project/rte/protocol"
)

const (
	dockerHost  = "unix:///var/run/docker.sock"
	dockerImage = "rte:dev"
)

func requireDocker(t *testing.T) *client.Client {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: this test uses the real Docker engine")
	}
	cli := testenv.EngineClient(t, "Docker", dockerHost)
	testenv.RequireImage(t, dockerImage, "rte")
	return cli
}

// dockerSettings run the RTE with RTE_ENGINE=docker (which needs transfer mode).
func dockerSettings(dir string, more ...string) []string {
	return append([]string{"RTE_ENGINE=docker", "RTE_IMAGE=" + dockerImage, "RTE_ENGINE_HOST=" + dockerHost,
		"RTE_FILES=transfer", "RTE_CACHE_PATH=" + filepath.Join(dir, "cache")}, more...)
}

// A container a killed RTE left running for a job the spool says was running is removed at the
// next start and the job ends abandoned; a container labelled with another RTE's name is left
// alone.
func TestRestoreRemovesLeftContainers(t *testing.T) {
	cli := requireDocker(t)
	ctx := context.Background()
	run := func(name, job string) string {
		c, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: &container.Config{
			Image: dockerImage, Entrypoint: []string{"sleep", "311"},
			Labels: map[string]string{jobs.LabelName: name, jobs.LabelJob: job}}})
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		t.Cleanup(func() { _, _ = cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true}) })
		if _, err := cli.ContainerStart(ctx, c.ID, client.ContainerStartOptions{}); err != nil {
			t.Fatalf("start: %v", err)
		}
		return c.ID
	}
	dir := t.TempDir()
	const job = "left-in-docker"
	own := run(runner, job)
	other := run(runner+"-other", job)

	sp, err := spool.Open(filepath.Join(dir, "spool"), spool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	startData, _ := json.Marshal(protocol.StartData{PID: 0, Instance: "testhost", Playbook: "sleep.yml"})
	if _, err := sp.Append(job, protocol.KindStart, startData); err != nil {
		t.Fatal(err)
	}
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}

	r := startWith(t, dir, nil, 0, dockerSettings(dir)...)
	if !r.logged("removed a job container left by the previous start") {
		t.Error("no log line saying the left container was removed")
	}
	r.stop()
	if _, err := cli.ContainerInspect(ctx, own, client.ContainerInspectOptions{}); err == nil {
		t.Error("the container this RTE left is still there")
	}
	ins, err := cli.ContainerInspect(ctx, other, client.ContainerInspectOptions{})
	if err != nil || ins.Container.State == nil || !ins.Container.State.Running {
		t.Errorf("the other RTE's container was touched: %v", err)
	}

	sp, err = spool.Open(filepath.Join(dir, "spool"), spool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	var recs []protocol.Record
	if err := sp.Pending(job, 0, func(rec protocol.Record, _ []byte) error { recs = append(recs, rec); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 || recs[1].Kind != protocol.KindLog || recs[2].Kind != protocol.KindEnd {
		t.Fatalf("records of the job: %d, want start, log, end", len(recs))
	}
	if !strings.Contains(string(recs[1].Data), "its container was stopped and removed") {
		t.Errorf("log record %s, want it to say the container was removed", recs[1].Data)
	}
	var end protocol.EndData
	if err := json.Unmarshal(recs[2].Data, &end); err != nil {
		t.Fatal(err)
	}
	if end.Status != protocol.StatusAbandoned {
		t.Fatalf("end %+v, want abandoned", end)
	}
}

// /ready says so while the engine does not answer, or lacks the image under RTE_PULL=never.
func TestReadyNamesTheEngineProblem(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: this test starts the RTE with a container engine")
	}
	for _, c := range []struct{ name, setting, want string }{
		{"no engine", "RTE_ENGINE_HOST=unix:///nonexistent/docker.sock", "does not answer"},
		{"no image", "RTE_IMAGE=rte-test-no-such-image:never", "RTE_PULL=never"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "no image" {
				requireDocker(t)
			}
			dir := t.TempDir()
			r := launch(t, dir, nil, 0, dockerSettings(dir, c.setting)...)
			var body string
			testenv.Eventually(t, time.Minute, "/ready naming the engine's problem", func() bool {
				code, b := r.get("/ready")
				body = b
				return code == http.StatusServiceUnavailable && strings.Contains(b, c.want)
			})
			if !strings.Contains(body, "job engine") {
				t.Errorf("/ready says %q, want it to name the job engine", body)
			}
		})
	}
}
