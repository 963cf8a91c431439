package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/internal/refapp/api"
	"github.com/rte-project/rte/internal/refapp/cli"
	"github.com/rte-project/rte/internal/refapp/settings"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/pinning"
	"github.com/rte-project/rte/protocol"
)

// Binaries are the two programs measured.
type Binaries struct{ RTE, App string }

// BuildBinaries builds rte and rte-app from the module at root into dir, each unless a path
// to it is given already.
func BuildBinaries(root, dir string, given Binaries) (Binaries, error) {
	b := given
	for _, c := range []struct {
		name string
		path *string
	}{{"rte", &b.RTE}, {"rte-app", &b.App}} {
		if *c.path != "" {
			if _, err := os.Stat(*c.path); err != nil {
				return b, fmt.Errorf("-%s %s: %w", c.name, *c.path, err)
			}
			continue
		}
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, c.name), "./cmd/"+c.name)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return b, fmt.Errorf("go build ./cmd/%s in %s: %v\n%s", c.name, root, err, out)
		}
		*c.path = filepath.Join(dir, c.name)
	}
	return b, nil
}

// appProc is `rte-app serve` as its own process, with a SQLite store in its directory: the
// tests' process runner (testenv.LaunchRTE runs any binary with arguments), its log also in
// app.log.
type appProc struct {
	*testenv.RTE
	URL   string
	Token string
	log   *os.File
}

// startApp starts `rte-app serve` in dir, seeded with seed (a YAML file; none when empty),
// and waits until its admin API answers.
func startApp(ctx context.Context, bin, dir, seed string) (*appProc, *cli.Client, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, err
	}
	port, err := testenv.FreePort()
	if err != nil {
		return nil, nil, err
	}
	p := &appProc{URL: fmt.Sprintf("http://127.0.0.1:%d", port), Token: settings.NewToken()}
	if p.log, err = os.Create(filepath.Join(dir, "app.log")); err != nil {
		return nil, nil, err
	}
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + dir,
		"APP_LISTEN=127.0.0.1:" + strconv.Itoa(port),
		"APP_DB=" + filepath.Join(dir, "app.db"),
		"APP_ADMIN_TOKEN=" + p.Token,
		"APP_NODE=bench-app",
		"LOG_LEVEL=warn",
	}
	if seed != "" {
		env = append(env, "APP_SEED="+seed)
	}
	if p.RTE, err = testenv.LaunchRTE(testenv.RTEConfig{Bin: bin, Args: []string{"serve"}, Dir: dir, Env: env,
		Log: p.log, SysProcAttr: testenv.OwnGroupTiedToParent()}); err != nil {
		p.log.Close()
		return nil, nil, fmt.Errorf("start %s serve: %w", bin, err)
	}
	c, err := cli.NewClient(p.URL, p.Token)
	if err != nil {
		p.Stop()
		return nil, nil, err
	}
	up := testenv.Poll(time.Minute, func() bool {
		select {
		case <-p.Done():
			return true
		default:
		}
		_, err := c.Runners(ctx)
		return err == nil
	})
	select {
	case <-p.Done():
		err := fmt.Errorf("rte-app serve exited (%v); its log:\n%s", p.Err(), testenv.Tail(p.Log(), 20))
		p.log.Close()
		return nil, nil, err
	default:
	}
	if !up {
		p.Stop()
		return nil, nil, fmt.Errorf("rte-app serve did not answer within a minute; its log:\n%s", testenv.Tail(p.Log(), 20))
	}
	return p, c, nil
}

// Stop sends SIGTERM, waits up to 30 s, then kills, and closes app.log once nothing writes it.
func (p *appProc) Stop() {
	_ = p.RTE.Stop(30 * time.Second)
	p.log.Close()
}

// Rig is the RTE path: `rte-app serve` (SQLite, synchronous=FULL) and one inbound rte process
// over TLS whose certificate the app's seed pins, connected and ready for jobs.
type Rig struct {
	Dir    string
	Name   string
	App    *appProc
	RTE    *testenv.RTE
	Client *cli.Client
}

// RigConfig says how to start a Rig.
type RigConfig struct {
	Bin  Binaries
	Dir  string
	Path string // the RTE's PATH: where it finds ansible-playbook (or the stand-in)
	// AnsiblePath and RepoPath are the RTE's playbooks and inventories (RTE_FILES=local).
	AnsiblePath, RepoPath string
	Env                   []string // more RTE settings
}

const rigRunner = "bench-rte"

// StartRig starts the RTE, then the app seeded with it, and waits for the app's pinned socket.
func StartRig(ctx context.Context, cfg RigConfig) (*Rig, error) {
	rteDir := filepath.Join(cfg.Dir, "rte")
	if err := os.MkdirAll(rteDir, 0o700); err != nil {
		return nil, err
	}
	certPath, keyPath := filepath.Join(rteDir, "cert.pem"), filepath.Join(rteDir, "key.pem")
	id, err := pinning.LoadOrCreate(certPath, keyPath, []string{"127.0.0.1"})
	if err != nil {
		return nil, err
	}
	port, err := testenv.FreePort()
	if err != nil {
		return nil, err
	}
	token := settings.NewToken()
	url := fmt.Sprintf("https://127.0.0.1:%d", port)
	env := append([]string{
		"PATH=" + cfg.Path, "HOME=" + rteDir, "LANG=C.UTF-8",
		"RTE_TOKEN=" + token, "RTE_NAME=" + rigRunner,
		"HTTPS=1", "HTTPS_CERT=" + certPath, "HTTPS_KEY=" + keyPath,
		"LISTEN_HOST=127.0.0.1", "PORT=" + strconv.Itoa(port),
		"RTE_FILES=local", "ANSIBLE_PATH=" + cfg.AnsiblePath, "REPO_PATH=" + cfg.RepoPath,
		"RTE_SPOOL_PATH=" + filepath.Join(rteDir, "spool"),
		"RTE_WORK_PATH=" + filepath.Join(rteDir, "jobs"),
		"RTE_CACHE_PATH=" + filepath.Join(rteDir, "cache"),
		"RTE_DRAIN_SECONDS=5",
		// The output-heavy job prints 100 MB; the default keeps 100 MiB per job.
		"PROCESS_MAX_BUFFER=" + strconv.Itoa(4<<30),
		"LOG_FORMAT=json", "LOG_LEVEL=warn",
	}, cfg.Env...)
	logFile, err := os.Create(filepath.Join(rteDir, "rte.log"))
	if err != nil {
		return nil, err
	}
	rte, err := testenv.LaunchRTE(testenv.RTEConfig{Bin: cfg.Bin.RTE, Dir: rteDir, Env: env, Log: logFile,
		SysProcAttr: testenv.OwnGroupTiedToParent()})
	if err != nil {
		logFile.Close()
		return nil, err
	}
	r := &Rig{Dir: cfg.Dir, Name: rigRunner, RTE: rte}
	seed := filepath.Join(cfg.Dir, "seed.yml")
	yaml := fmt.Sprintf("runners:\n  - name: %s\n    rte_mode: inbound\n    url: %s\n    token: %s\n    certificate_sha256: %s\n",
		rigRunner, url, token, id.SHA256())
	if err := os.WriteFile(seed, []byte(yaml), 0o600); err != nil {
		r.Stop()
		return nil, err
	}
	if r.App, r.Client, err = startApp(ctx, cfg.Bin.App, filepath.Join(cfg.Dir, "app"), seed); err != nil {
		r.Stop()
		return nil, err
	}
	connected := testenv.Poll(2*time.Minute, func() bool {
		select {
		case <-rte.Done():
			return true
		default:
		}
		runners, err := r.Client.Runners(ctx)
		return err == nil && len(runners) == 1 && runners[0].Connected
	})
	select {
	case <-rte.Done():
		r.Stop()
		return nil, fmt.Errorf("the RTE exited (%v); its log:\n%s", rte.Err(), testenv.Tail(rte.Log(), 20))
	default:
	}
	if !connected {
		r.Stop()
		return nil, fmt.Errorf("the app did not connect to the RTE within 2 minutes; the RTE's log:\n%s\nthe app's:\n%s",
			testenv.Tail(rte.Log(), 20), testenv.Tail(r.App.Log(), 20))
	}
	return r, nil
}

// Stop stops the app, then the RTE.
func (r *Rig) Stop() {
	if r.App != nil {
		r.App.Stop()
	}
	if r.RTE != nil {
		_ = r.RTE.Stop(30 * time.Second)
	}
}

// Submit sends a job to the rig's RTE.
func (r *Rig) Submit(ctx context.Context, o api.JobOptions) (string, error) {
	if o.TimeoutS == 0 {
		o.TimeoutS = 3600
	}
	j, err := r.Client.Submit(ctx, api.JobRequest{Runner: r.Name, JobOptions: o})
	return j.ID, err
}

// WaitEnded polls the job until the app has stored its end, and returns it.
func (r *Rig) WaitEnded(ctx context.Context, id string, within time.Duration) (api.JobView, error) {
	var j api.JobView
	var err error
	testenv.Poll(within, func() bool {
		j, err = r.Client.Job(ctx, id)
		return err == nil && j.State == string(app.JobEnded)
	})
	if err != nil {
		return j, err
	}
	if j.State != string(app.JobEnded) {
		return j, fmt.Errorf("job %s is still %s after %s", id, j.State, within)
	}
	return j, nil
}

// Stored counts what the app's store holds for a job: output bytes, events, records.
type Stored struct {
	Records     int64
	OutputBytes int64
	Events      int64
	Status      string
}

// recordsPage is the records asked for at a time: the client reads an answer up to
// sse.MaxEventBytes, and an output record holds up to 64 KiB of text, escaped in JSON.
const recordsPage = 16

// Count reads every stored record of the job back through the admin API.
func (r *Rig) Count(ctx context.Context, id string) (Stored, error) {
	var s Stored
	var after int64
	for {
		recs, err := r.Client.Records(ctx, id, after, recordsPage)
		if err != nil {
			return s, err
		}
		if len(recs) == 0 {
			return s, nil
		}
		for _, rec := range recs {
			if rec.Seq != after+1 {
				return s, fmt.Errorf("job %s: record %d follows %d", id, rec.Seq, after)
			}
			after = rec.Seq
			s.Records++
			if err := s.add(rec); err != nil {
				return s, err
			}
		}
	}
}

func (s *Stored) add(rec protocol.Record) error {
	switch rec.Kind {
	case protocol.KindOutput:
		var d protocol.OutputData
		if err := json.Unmarshal(rec.Data, &d); err != nil {
			return fmt.Errorf("output record %d: %w", rec.Seq, err)
		}
		s.OutputBytes += int64(len(d.Text))
	case protocol.KindEvents:
		var d protocol.EventsData
		if err := json.Unmarshal(rec.Data, &d); err != nil {
			return fmt.Errorf("events record %d: %w", rec.Seq, err)
		}
		s.Events += int64(len(d.Events))
	case protocol.KindEnd:
		var d protocol.EndData
		if err := json.Unmarshal(rec.Data, &d); err != nil {
			return fmt.Errorf("end record %d: %w", rec.Seq, err)
		}
		s.Status = d.Status
	}
	return nil
}
