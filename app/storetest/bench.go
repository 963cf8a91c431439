package storetest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/protocol"
)

// BenchRecords measures the throughput that bounds a busy runner's output, the same way for
// every store: batches of 64 records of one job, each batch one StoreRecords call (one
// transaction, one durable commit). output-64KiB is full output records (the RTE's batching
// limit); event-512B is small events records, where the per-record cost shows. open returns a
// new, empty store and arranges its closing. It reports records/s beside the bytes/s.
func BenchRecords(b *testing.B, open func(b *testing.B) app.Store) {
	for _, bc := range []struct {
		name string
		size int
	}{{"output-64KiB", 64 << 10}, {"event-512B", 512}} {
		b.Run(bc.name, func(b *testing.B) { benchRecords(b, open(b), 64, bc.size) })
	}
}

func benchRecords(b *testing.B, s app.Store, batch, size int) {
	ctx := context.Background()
	if err := s.CreateJob(ctx, &app.Job{ID: "bench", Runner: "rte01", State: app.JobRunning, CreatedAt: t0,
		Start: protocol.JobStart{Job: "bench", Playbook: "site.yml"}}); err != nil {
		b.Fatal(err)
	}
	text := strings.Repeat("ok: [web01] => changed\n", size/23+1)[:size-len(`{"text":""}`)]
	data, _ := json.Marshal(protocol.OutputData{Text: text})
	recs := make([]protocol.Record, batch)
	b.SetBytes(int64(batch * len(data)))
	seq := int64(0)
	for b.Loop() {
		for i := range recs {
			seq++
			recs[i] = protocol.Record{Job: "bench", Seq: seq, Kind: protocol.KindOutput, At: t0, Data: data}
		}
		heads, err := s.StoreRecords(ctx, recs)
		if err != nil || heads["bench"] != seq {
			b.Fatalf("store: %v, head %d, want %d", err, heads["bench"], seq)
		}
	}
	b.ReportMetric(float64(seq)/b.Elapsed().Seconds(), "records/s")
}
