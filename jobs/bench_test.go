package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rte-project/rte/jobs"
	"github.com/rte-project/rte/jobs/afevents"
	"github.com/rte-project/rte/protocol"
)

// discardRecorder keeps nothing; it counts records and signals ends and starts.
type discardRecorder struct {
	mu      sync.Mutex
	records int
	started map[string]chan struct{}
	ended   map[string]chan struct{}
}

func newDiscardRecorder() *discardRecorder {
	return &discardRecorder{started: map[string]chan struct{}{}, ended: map[string]chan struct{}{}}
}

func (d *discardRecorder) watch(job string) (started, ended chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.started[job], d.ended[job] = make(chan struct{}), make(chan struct{})
	return d.started[job], d.ended[job]
}

func (d *discardRecorder) Append(job, kind string, _ json.RawMessage) (protocol.Record, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.records++
	switch kind {
	case protocol.KindOutput:
		// The first output means the job's readers and batches are in use: what a running
		// job holds.
		if c := d.started[job]; c != nil {
			close(c)
			d.started[job] = nil
		}
	case protocol.KindEnd:
		close(d.ended[job])
	}
	return protocol.Record{Job: job, Seq: int64(d.records), Kind: kind}, nil
}

func (d *discardRecorder) Has(string) bool { return false }

func benchManager(b *testing.B, binary string, rec jobs.Recorder) *jobs.Manager {
	b.Helper()
	tmp := b.TempDir()
	pluginDir, err := afevents.Install(filepath.Join(tmp, "plugins"))
	if err != nil {
		b.Fatal(err)
	}
	root := filepath.Join(tmp, "playbooks")
	if err := os.Mkdir(root, 0o700); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "site.yml"), []byte("- hosts: all\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	m, err := jobs.New(jobs.Config{
		Recorder:        rec,
		Files:           jobs.LocalFiles{AnsiblePath: root},
		Token:           testToken,
		WorkDir:         filepath.Join(tmp, "work"),
		PluginDir:       pluginDir,
		AnsiblePlaybook: binary,
		BaseEnv:         []string{"PATH=" + os.Getenv("PATH")},
		KillGrace:       time.Second,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), safetyNet)
		defer cancel()
		m.Drain(ctx, 0)
		m.Wait()
	})
	return m
}

// BenchmarkOutputPipeline measures one job's output path end to end: a fake child writes
// 64 MiB of ansible-like lines through the real pipe, and the Manager reads, masks (one
// secret), checks UTF-8, batches and encodes it into records for a Recorder that discards
// them. MB/s is output bytes per second; allocs are per job, process start included.
func BenchmarkOutputPipeline(b *testing.B) {
	const size = 64 << 20
	rec := newDiscardRecorder()
	m := benchManager(b, os.Args[0], rec)
	b.SetBytes(size)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		id := "bench-" + strconv.Itoa(i)
		_, ended := rec.watch(id)
		js := &protocol.JobStart{Job: id, Playbook: "site.yml",
			Env:     map[string]string{fakeChildEnv: "flood", "JOBS_FAKE_BYTES": strconv.Itoa(size)},
			Secrets: map[string]string{"vault_password": mustSeal(b, id, "a-vault-password")},
		}
		if err := m.Start(js); err != nil {
			b.Fatal(err)
		}
		<-ended
	}
}

// BenchmarkJobMemory reports what the Manager itself holds per running job (the children's
// own memory is not counted): 50 jobs whose child printed a line and sleeps. heap-B/job is the
// live heap growth per job, stack-B/job the goroutine stacks.
func BenchmarkJobMemory(b *testing.B) {
	const n = 50
	script := filepath.Join(b.TempDir(), "fake-ansible-playbook")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho sleeping\nexec sleep 3600\n"), 0o700); err != nil {
		b.Fatal(err)
	}
	rec := newDiscardRecorder()
	m := benchManager(b, script, rec)
	var heap, stack float64
	rounds := 0
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		var ends []chan struct{}
		for i := 0; i < n; i++ {
			id := fmt.Sprintf("mem-%d-%d", rounds, i)
			started, ended := rec.watch(id)
			if err := m.Start(&protocol.JobStart{Job: id, Playbook: "site.yml"}); err != nil {
				b.Fatal(err)
			}
			<-started
			ends = append(ends, ended)
		}
		time.Sleep(200 * time.Millisecond) // let the output batches flush
		runtime.GC()
		runtime.ReadMemStats(&after)
		heap += float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
		stack += float64(int64(after.StackInuse)-int64(before.StackInuse)) / n
		for _, id := range m.Running() {
			m.Cancel(id)
		}
		for _, e := range ends {
			<-e
		}
		rounds++
	}
	b.ReportMetric(heap/float64(rounds), "heap-B/job")
	b.ReportMetric(stack/float64(rounds), "stack-B/job")
}

func mustSeal(b *testing.B, job, secret string) string {
	s, err := protocol.SealSecret(testToken, job, secret)
	if err != nil {
		b.Fatal(err)
	}
	return s
}
