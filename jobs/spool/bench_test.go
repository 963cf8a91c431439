package spool_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rte-project/rte/jobs/spool"
	"github.com/rte-project/rte/protocol"
)

// BenchmarkAppend measures Append with fsync on, as in production, on the file system of
// TMPDIR (point it at the disk the spool will live on). MB/s counts record data. records/fsync
// shows the group commit within a job: with many appenders on one job it must be well above 1.
// Each job is its own file and needs its own fsync, so with one appender per job it stays near
// 1; records/pass shows that those fsyncs still run together, one pass for many jobs.
func BenchmarkAppend(b *testing.B) {
	for _, size := range []struct {
		name  string
		bytes int
	}{{"200B", 200}, {"64KiB", 64 << 10}} {
		for _, c := range []struct{ appenders, jobs int }{{1, 1}, {8, 8}, {8, 1}} {
			name := fmt.Sprintf("size=%s/appenders=%d/jobs=%d", size.name, c.appenders, c.jobs)
			b.Run(name, func(b *testing.B) { benchAppend(b, size.bytes, c.appenders, c.jobs) })
		}
	}
}

func benchAppend(b *testing.B, size, appenders, jobs int) {
	s, err := spool.Open(b.TempDir(), spool.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	data := outputOfSize(size)
	b.SetBytes(int64(len(data)))
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for w := range appenders {
		wg.Go(func() {
			job := fmt.Sprintf("bench-%d", w%jobs)
			for next.Add(1) <= int64(b.N) {
				if _, err := s.Append(job, protocol.KindOutput, data); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	st := s.Stats()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "records/s")
	b.ReportMetric(float64(st.Records)/float64(max(st.Syncs, 1)), "records/fsync")
	b.ReportMetric(float64(st.Records)/float64(max(st.Commits, 1)), "records/pass")
}

// outputOfSize is an output record's data of exactly n bytes of JSON, lines of playbook output.
func outputOfSize(n int) json.RawMessage {
	text := strings.Repeat("ok: [web01] => (item=nginx) changed\n", n/30+1)
	for {
		data, _ := json.Marshal(protocol.OutputData{Text: text})
		if len(data) <= n {
			return append(data[:len(data)-2], strings.Repeat(" ", n-len(data))+`"}`...)
		}
		text = text[:len(text)-(len(data)-n)]
	}
}

// BenchmarkPending measures the resend path: reading a job's records back from disk (the page
// cache, here) with their frames, as after a reconnect.
func BenchmarkPending(b *testing.B) {
	for _, size := range []int{200, 64 << 10} {
		b.Run(fmt.Sprintf("size=%dB", size), func(b *testing.B) {
			s, err := spool.Open(b.TempDir(), spool.Options{NoSync: true})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			data := outputOfSize(size)
			const records = 500
			for range records {
				if _, err := s.Append("j", protocol.KindOutput, data); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(records * int64(size))
			for b.Loop() {
				n := 0
				s.Pending("j", 0, func(protocol.Record, []byte) error { n++; return nil })
				if n != records {
					b.Fatalf("Pending gave %d records, want %d", n, records)
				}
			}
			b.ReportMetric(float64(records*b.N)/b.Elapsed().Seconds(), "records/s")
		})
	}
}
