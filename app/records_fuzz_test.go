package app

import (
	"testing"
	"time"
	"unicode/utf8"

	"github.com/rte-project/rte/protocol"
)

// FuzzApplyEnd feeds arbitrary end record data, which comes from the runner, to applyEnd:
// whatever comes, the job ends, with a status of protocol v1 and a bounded, valid message.
func FuzzApplyEnd(f *testing.F) {
	f.Add([]byte(`{"status":"success","exit_code":0}`))
	f.Add([]byte(`{"status":"failed","exit_code":2,"message":"1 host failed"}`))
	f.Add([]byte(`{"status":"exploded","exit_code":1}`))
	f.Add([]byte(`{"status":1}`))
	f.Add([]byte(`{"message":"\xff\xfe"}`))
	f.Add([]byte(`[]`))
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, data []byte) {
		j := &Job{ID: "j1", State: JobRunning}
		applyEnd(j, protocol.Record{Job: "j1", Seq: 3, Kind: protocol.KindEnd, At: at, Data: data})
		if j.State != JobEnded || !knownStatus[j.Status] || !j.EndedAt.Equal(at) {
			t.Fatalf("end %q left the job %s with status %q at %s", data, j.State, j.Status, j.EndedAt)
		}
		if !utf8.ValidString(j.Message) || len(j.Message) > maxEndMessage+300 {
			t.Fatalf("end %q gave a message of %d bytes, valid UTF-8 %v", data, len(j.Message), utf8.ValidString(j.Message))
		}
	})
}
