package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/pinning"
	"github.com/rte-project/rte/protocol"
)

// BenchmarkPinnedHandshake measures what the app pays to (re)connect an inbound RTE: TCP, TLS
// with the pin check, the WebSocket upgrade with the token, and hello/welcome, against the real
// rte binary on loopback.
func BenchmarkPinnedHandshake(b *testing.B) {
	dir := b.TempDir()
	port := freePort(b)
	rte := startRTE(b, dir, port, "HTTPS=1", "RTE_TOKEN="+testToken, "LOG_LEVEL=warn")
	der, err := pinning.LoadCertificateFile(filepath.Join(dir, "certificates", "cert.pem"))
	if err != nil {
		b.Fatal(err)
	}
	_ = rte
	a := startAppSide(b, withAppConfig(func(c *app.Config) { c.Node, c.Logger = "bench", nil })).App
	ctx := context.Background()
	if err := a.AddRunner(ctx, &app.Runner{Name: "bench", URL: fmt.Sprintf("https://127.0.0.1:%d", port),
		Mode: protocol.ModeInbound, Token: testToken, CertificateSHA256: protocol.CertificateSHA256(der)}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		peer, err := a.Connect(cctx, "bench")
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		peer.Conn.Close(websocket.CloseNormalClosure, "bench")
	}
}

// fakeAnsible writes an ansible-playbook stand-in into a directory for the load harness: it
// answers --version like Debian's ansible-core and otherwise prints BENCH_BYTES bytes of
// 100-byte lines as fast as the pipe takes them, or sleeps BENCH_SLEEP seconds. Ansible's own
// speed is not what these benchmarks measure: the RTE and the app half are.
func fakeAnsible(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	script := `#!/bin/sh
if [ "$1" = "--version" ]; then echo "ansible-playbook [core 2.14.18]"; exit 0; fi
if [ -n "$BENCH_SLEEP" ]; then exec sleep "$BENCH_SLEEP"; fi
yes "$(printf '%099d' 7)" | head -c "$BENCH_BYTES"
`
	if err := os.WriteFile(filepath.Join(dir, "ansible-playbook"), []byte(script), 0o755); err != nil {
		tb.Fatal(err)
	}
	return dir
}

// BenchmarkPipeline measures a job's stdout all the way to the app's committed store: the RTE
// batches it into records, spools them with fsync, sends them over TLS; the app half stores
// them in SQLite (synchronous=FULL) and acks. Each op is one job of 64 MiB of output.
func BenchmarkPipeline(b *testing.B) {
	const perJob = 64 << 20
	r := newJobRig(b, withRTEEnv("PATH="+fakeAnsible(b)+":"+os.Getenv("PATH"), "LOG_LEVEL=info"))
	var records int
	b.SetBytes(perJob)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		j := r.submit(protocol.JobStart{Playbook: "hello.yml", Inventories: []string{"local.ini"},
			Env: map[string]string{"BENCH_BYTES": strconv.Itoa(perJob)}})
		end := r.waitEnd(j.ID, 10*time.Minute)
		if end.Status != protocol.StatusSuccess {
			b.Fatalf("job %+v", end)
		}
		records += int(end.LastSeq)
	}
	b.StopTimer()
	b.ReportMetric(float64(records)/time.Since(start).Seconds(), "records/s")
}

// BenchmarkJobMemory measures the RTE's own memory per running job: 50 jobs whose stand-in
// sleeps, the Go heap and goroutine stacks in use (from the RTE's /metrics) before and while
// they run, divided by 50. Ansible's own processes are not counted: they are other processes.
// RSS is reported too, but the Go runtime keeps freed pages, so its difference says little.
func BenchmarkJobMemory(b *testing.B) {
	const n = 50
	r := newJobRig(b, withRTEEnv("PATH="+fakeAnsible(b)+":"+os.Getenv("PATH"), "RTE_MAX_JOBS=0", "LOG_LEVEL=warn",
		"METRICS_TOKEN=metrics-token-0123456789"))
	for i := 0; i < b.N; i++ {
		time.Sleep(time.Second)
		before := goMemory(b, r.RTE)
		var ids []string
		for k := 0; k < n; k++ {
			ids = append(ids, r.submit(protocol.JobStart{Playbook: "hello.yml", Inventories: []string{"local.ini"},
				Env: map[string]string{"BENCH_SLEEP": "20"}}).ID)
		}
		// Measure only once the RTE itself reports every job running.
		deadline := time.Now().Add(time.Minute)
		for {
			if st, ok := r.App.Status(r.Name); ok && st.Capacity.Running == n {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("the RTE never reported %d running jobs", n)
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(time.Second)
		during := goMemory(b, r.RTE)
		b.ReportMetric(float64(during-before)/n/1024, "KiB/job")
		b.ReportMetric(float64(rss(b, r.RTE.Pid()))/1024/1024, "MiB-RSS-50-jobs")
		for _, id := range ids {
			_ = r.App.Cancel(context.Background(), id)
		}
		for _, id := range ids {
			r.waitEnd(id, time.Minute)
		}
	}
}

// goMemory is the heap and stack memory the RTE's Go runtime has in use, from /metrics.
func goMemory(tb testing.TB, p *rteProc) int64 {
	tb.Helper()
	code, body := p.Probe("/metrics", "Authorization", "Bearer metrics-token-0123456789")
	if code != 200 {
		tb.Fatalf("/metrics = %d", code)
	}
	var total int64
	for _, line := range strings.Split(body, "\n") {
		for _, name := range []string{"go_memstats_heap_inuse_bytes ", "go_memstats_stack_inuse_bytes "} {
			if v, ok := strings.CutPrefix(line, name); ok {
				f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
				total += int64(f)
			}
		}
	}
	if total == 0 {
		tb.Fatal("no go_memstats in /metrics")
	}
	return total
}

// rss reads a process's resident set size in bytes.
func rss(tb testing.TB, pid int) int64 {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return kb * 1024
		}
	}
	tb.Fatal("no VmRSS")
	return 0
}
