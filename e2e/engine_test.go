package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/jobs"
	"github.com/rte-project/rte/protocol"
)

const (
	engineHost  = "unix:///var/run/docker.sock"
	engineImage = "rte:dev"
)

// dockerClient skips when no Docker engine answers, and builds the job image when it is missing.
func dockerClient(t *testing.T) *client.Client {
	t.Helper()
	return engineClient(t, "docker", engineHost)
}

// engineClient skips when no engine answers at host.
func engineClient(t *testing.T, engine, host string) *client.Client {
	t.Helper()
	cli := testenv.EngineClient(t, engine, host)
	if engine == "docker" {
		testenv.RequireImage(t, engineImage, "rte")
	}
	return cli
}

// TestJobsInContainers runs the real rte binary with RTE_ENGINE=docker, then podman, against
// the real app half in transfer mode: the allowed images in hello, an image refused, success,
// failure, a masked secret, cancel, timeout, capacity, a SIGKILL of the RTE mid-job after which
// the job's container is gone and the job ends abandoned at the app, and a drain.
func TestJobsInContainers(t *testing.T) {
	t.Run("docker", func(t *testing.T) { containerSuite(t, "docker", engineHost) })
	t.Run("podman", func(t *testing.T) {
		dockerClient(t) // podman's copy of the image comes from Docker's store
		containerSuite(t, "podman", testenv.PodmanHost(t, engineImage, "rte"))
	})
}

func containerSuite(t *testing.T, engine, host string) {
	cli := engineClient(t, engine, host)
	src := newPackSource(t)
	r := newJobRig(t, withRTEEnv("RTE_FILES=transfer", "RTE_CACHE_PATH="+t.TempDir(),
		"RTE_ENGINE="+engine, "RTE_IMAGE="+engineImage, "RTE_ENGINE_HOST="+host, "RTE_JOB_MEMORY=512m",
		"RTE_IMAGES_ALLOW=registry.example/ee-*:*", "RTE_MAX_JOBS=1"),
		withApp(func(c *app.Config) { c.Files = src }))
	containers := func() []string {
		res, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true,
			Filters: make(client.Filters).Add("label", jobs.LabelName+"="+r.Name)})
		if err != nil {
			t.Fatalf("list containers: %v", err)
		}
		var ids []string
		for _, c := range res.Items {
			ids = append(ids, c.ID[:12]+" "+c.Labels[jobs.LabelJob])
		}
		return ids
	}

	t.Run("hello lists the images", func(t *testing.T) {
		st, ok := r.App.Status(r.Name)
		if got := strings.Join(st.Hello.Images, " "); !ok || got != engineImage+" registry.example/ee-*:*" {
			t.Fatalf("hello images %q (connected %v), want RTE_IMAGE then RTE_IMAGES_ALLOW", got, ok)
		}
	})

	t.Run("image not allowed", func(t *testing.T) {
		ctx := context.Background()
		js := protocol.JobStart{Playbook: "hello.yml", Inventories: []string{"local.ini"}, Image: "registry.example/other:1"}
		// The app refuses it at submit, from the images the runner's hello listed...
		if j, err := r.App.Submit(ctx, app.JobRequest{Runner: r.Name, JobStart: js}); !errors.Is(err, app.ErrInvalidJob) ||
			!strings.Contains(err.Error(), "does not run registry.example/other:1: its RTE allows "+engineImage+", registry.example/ee-*:*") {
			t.Fatalf("Submit of an image the runner does not allow = %+v, %v; want ErrInvalidJob naming it and what the RTE allows", j, err)
		}
		// ...and the RTE refuses it itself for an app that did not check (here: one that never
		// stored the runner's images).
		runner, err := r.Store.GetRunner(ctx, r.Name)
		if err != nil || len(runner.Images) != 2 {
			t.Fatalf("stored runner %+v (%v), want the two images of its hello", runner, err)
		}
		runner.Images = nil
		if err := r.Store.PutRunner(ctx, runner); err != nil {
			t.Fatal(err)
		}
		j := r.submit(js)
		end := r.waitEnd(j.ID, time.Minute)
		if end.Status != protocol.StatusError || !strings.Contains(end.Message, "image: registry.example/other:1 is not allowed on this RTE") {
			t.Fatalf("job %+v, want an error end naming the image", end)
		}
		if left := containers(); len(left) != 0 {
			t.Fatalf("containers after a refused image: %v", left)
		}
	})

	t.Run("success", func(t *testing.T) {
		j := r.submit(protocol.JobStart{Playbook: "hello.yml", Inventories: []string{"local.ini"},
			Extravars: json.RawMessage(`{"who":"container"}`)})
		end := r.waitEnd(j.ID, 2*time.Minute)
		s := r.story(j.ID)
		if end.Status != protocol.StatusSuccess || s.End.ExitCode != 0 || s.Records[0].Kind != protocol.KindStart {
			t.Fatalf("job %+v, end record %+v, want success after a start record", end, s.End)
		}
		if !strings.Contains(s.Output, "hello container") || !s.hasEvent("playbook_on_stats") {
			t.Fatalf("output or events lack the playbook's: %v\n%s", s.eventNames(), s.Output)
		}
	})

	t.Run("failure", func(t *testing.T) {
		j := r.submit(protocol.JobStart{Playbook: "fail.yml", Inventories: []string{"local.ini"}})
		end := r.waitEnd(j.ID, 2*time.Minute)
		if s := r.story(j.ID); end.Status != protocol.StatusFailed || s.End.ExitCode != 2 || !s.hasEvent("runner_on_failed") {
			t.Fatalf("job %+v end %+v, want failed with exit 2", end, s.End)
		}
	})

	// Inside the container 127.0.0.1 is the container's own loopback, where nothing listens
	// on port 1: ansible's ssh gets a refusal, as from a host that is down.
	t.Run("unreachable", func(t *testing.T) {
		j := r.submit(protocol.JobStart{Playbook: "hello.yml", Inventories: []string{"unreachable.ini"},
			Env: map[string]string{"ANSIBLE_HOST_KEY_CHECKING": "False"}})
		end := r.waitEnd(j.ID, 2*time.Minute)
		s := r.story(j.ID)
		if end.Status != protocol.StatusFailed || s.End.ExitCode != 4 || !s.hasEvent("runner_on_unreachable") {
			t.Fatalf("job %+v end %+v events %v, want failed with exit 4 and runner_on_unreachable", end, s.End, s.eventNames())
		}
	})

	t.Run("no_log and a masked secret", func(t *testing.T) {
		const secret = "vault-pw-c0n7a1"
		j := r.submit(protocol.JobStart{Playbook: "secrets.yml", Inventories: []string{"local.ini"},
			Extravars: json.RawMessage(`{"marker":"m42k","leak":"` + secret + `"}`),
			Secrets:   map[string]string{"vault_password": secret}})
		r.waitEnd(j.ID, 2*time.Minute)
		s := r.story(j.ID)
		for _, rec := range s.Records {
			if strings.Contains(string(rec.Data), secret) || strings.Contains(string(rec.Data), "nolog-value-m42k") {
				t.Fatalf("a secret or no_log value reached the app in %s record %d", rec.Kind, rec.Seq)
			}
		}
		if !strings.Contains(s.Output, "the value is ********") {
			t.Fatalf("the masked secret is not shown as ********:\n%s", s.Output)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		j := r.submit(protocol.JobStart{Playbook: "sleep.yml", Inventories: []string{"local.ini"},
			Extravars: json.RawMessage(`{"seconds":"307"}`)})
		r.waitState(j.ID, app.JobRunning, time.Minute)
		if err := r.App.Cancel(t.Context(), j.ID); err != nil {
			t.Fatal(err)
		}
		if end := r.waitEnd(j.ID, time.Minute); end.Status != protocol.StatusCanceled {
			t.Fatalf("job %+v, want canceled", end)
		}
		r.story(j.ID)
		if left := containers(); len(left) != 0 {
			t.Fatalf("containers after cancel: %v", left)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		j := r.submit(protocol.JobStart{Playbook: "sleep.yml", Inventories: []string{"local.ini"},
			Extravars: json.RawMessage(`{"seconds":"313"}`), TimeoutS: 3})
		if end := r.waitEnd(j.ID, 2*time.Minute); end.Status != protocol.StatusTimeout {
			t.Fatalf("job %+v, want timeout", end)
		}
		r.story(j.ID)
		if left := containers(); len(left) != 0 {
			t.Fatalf("containers after the timeout: %v", left)
		}
	})

	// RTE_MAX_JOBS=1: the second job waits in the app's queue while the first one's container
	// runs, then runs; both succeed.
	t.Run("capacity", func(t *testing.T) {
		first := r.submit(protocol.JobStart{Playbook: "sleep.yml", Inventories: []string{"local.ini"},
			Extravars: json.RawMessage(`{"seconds":"4"}`)})
		r.waitState(first.ID, app.JobRunning, time.Minute)
		second := r.submit(protocol.JobStart{Playbook: "hello.yml", Inventories: []string{"local.ini"},
			Extravars: json.RawMessage(`{"who":"second"}`)})
		for range 10 {
			if j, err := r.App.GetJob(t.Context(), second.ID); err == nil && j.State == app.JobRunning {
				if f, err := r.App.GetJob(t.Context(), first.ID); err == nil && f.State == app.JobRunning {
					t.Fatalf("both jobs run at once with RTE_MAX_JOBS=1")
				}
			}
			if left := containers(); len(left) > 1 {
				t.Fatalf("containers %v, want at most one with RTE_MAX_JOBS=1", left)
			}
			time.Sleep(200 * time.Millisecond)
		}
		for _, j := range []*app.Job{first, second} {
			if end := r.waitEnd(j.ID, 2*time.Minute); end.Status != protocol.StatusSuccess {
				t.Fatalf("job %+v, want success", end)
			}
			r.story(j.ID)
		}
	})

	t.Run("SIGKILL mid-job", func(t *testing.T) {
		j := r.submit(protocol.JobStart{Playbook: "sleep.yml", Inventories: []string{"local.ini"},
			Extravars: json.RawMessage(`{"seconds":"309"}`)})
		r.waitState(j.ID, app.JobRunning, time.Minute)
		// The start record stored at the app: the container runs ansible-playbook.
		if !testenv.Poll(time.Minute, func() bool { return len(r.records(j.ID)) > 0 }) {
			t.Fatal("no record of the running job reached the app within a minute")
		}
		if left := containers(); len(left) != 1 {
			t.Fatalf("containers of the running job: %v, want one", left)
		}
		r.Restart() // SIGKILL, then the same directory, spool and name
		end := r.waitEnd(j.ID, 2*time.Minute)
		if end.Status != protocol.StatusAbandoned {
			t.Fatalf("job %+v, want abandoned after the RTE was killed", end)
		}
		s := r.story(j.ID) // every record once, in order, the end last
		if !strings.Contains(s.Output+strings.Join(logTexts(s.Records), "\n"), "its container was stopped and removed") {
			t.Errorf("no record says the container was removed")
		}
		if left := containers(); len(left) != 0 {
			t.Fatalf("containers after the restart: %v", left)
		}
	})

	// SIGTERM drains: the running job's container gets RTE_DRAIN_SECONDS, is then stopped and
	// removed, and the job ends abandoned; the RTE exits 0.
	t.Run("drain", func(t *testing.T) {
		j := r.submit(protocol.JobStart{Playbook: "sleep.yml", Inventories: []string{"local.ini"},
			Extravars: json.RawMessage(`{"seconds":"311"}`)})
		r.waitState(j.ID, app.JobRunning, time.Minute)
		if !testenv.Poll(time.Minute, func() bool { return len(containers()) == 1 }) {
			t.Fatalf("containers of the running job: %v, want one", containers())
		}
		r.RTE.Signal(syscall.SIGTERM)
		if code := r.RTE.Wait(time.Minute); code != 0 {
			t.Fatalf("exit status %d after a drain, want 0", code)
		}
		if left := containers(); len(left) != 0 {
			t.Fatalf("containers after the drain: %v", left)
		}
		r.Restart()
		if end := r.waitEnd(j.ID, time.Minute); end.Status != protocol.StatusAbandoned {
			t.Fatalf("job %+v, want abandoned after the drain ran out", end)
		}
		r.story(j.ID)
	})
}

func logTexts(recs []protocol.Record) []string {
	var out []string
	for _, rec := range recs {
		if rec.Kind == protocol.KindLog {
			out = append(out, string(rec.Data))
		}
	}
	return out
}

// TestContainerJobsFromANonRootRTE: the RTE as the rte image's own user (uid and gid 10001),
// in the engine socket's group, runs each job in a container as that same uid: the job
// directory it made is the job's without a chown, the user's home in the image (/home/rte) is
// writable for ansible's temporary files, and the job's output comes back as for root.
func TestContainerJobsFromANonRootRTE(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: this test runs jobs in real containers")
	}
	dockerClient(t)
	sock, err := os.Stat(strings.TrimPrefix(engineHost, "unix://"))
	if err != nil {
		t.Fatal(err)
	}
	const uid = 10001 // the rte user of the image (Dockerfile)
	cred := &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{sock.Sys().(*syscall.Stat_t).Gid}}
	src := newPackSource(t)
	whoami := `- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.command: id -u
      register: who
      changed_when: false
    - ansible.builtin.debug:
        msg: "job uid {{ who.stdout }}"
`
	if err := os.WriteFile(filepath.Join(src.playbooks, "whoami.yml"), []byte(whoami), 0o644); err != nil {
		t.Fatal(err)
	}
	r := newJobRig(t, asUser(cred), withRTEEnv("RTE_FILES=transfer", "RTE_ENGINE=docker",
		"RTE_IMAGE="+engineImage, "RTE_ENGINE_HOST="+engineHost),
		withApp(func(c *app.Config) { c.Files = src }))
	j := r.submit(protocol.JobStart{Playbook: "whoami.yml", Inventories: []string{"local.ini"}})
	end := r.waitEnd(j.ID, 2*time.Minute)
	s := r.story(j.ID)
	if end.Status != protocol.StatusSuccess || !strings.Contains(s.Output, fmt.Sprintf("job uid %d", uid)) {
		t.Fatalf("job %+v, want success run as uid %d; output:\n%s", end, uid, s.Output)
	}
}
