package spool

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/rte-project/rte/protocol"
)

// TestEnvelopeMatchesFullDecode pins Pending's cheap read to the full decode. If
// protocol.Record ever gets a key after data, this fails, and envelope must change with it.
func TestEnvelopeMatchesFullDecode(t *testing.T) {
	at := time.Date(2026, 12, 2, 10, 0, 0, 5, time.UTC)
	for i, tc := range []struct{ kind, data string }{
		{protocol.KindStart, `{"pid":42,"instance":"rte01","playbook":"site.yml"}`},
		{protocol.KindOutput, `{"text":"ok: [web01] => {\"data\": 1}\n,\"data\":{}"}`},
		{protocol.KindEvents, `{"events":[{"event":"runner_on_ok","event_data":{"res":{"data":{"x":[1,2]}}}}]}`},
		{protocol.KindLog, `{"level":"warn","message":"<&>"}`},
		{protocol.KindEnd, `{"status":"success","exit_code":0}`},
		{protocol.KindOutput, `{}`},
	} {
		rec := protocol.Record{Job: "job-1.a_b", Seq: int64(i + 1), Kind: tc.kind, At: at, Data: json.RawMessage(tc.data)}
		payload, err := protocol.Encode(rec)
		if err != nil {
			t.Fatal(err)
		}
		full, err := decodeRecord(payload, rec.Job, rec.Seq)
		if err != nil {
			t.Fatalf("decodeRecord(%s): %v", payload, err)
		}
		cheap, err := envelope(payload, rec.Job, rec.Seq)
		if err != nil {
			t.Fatalf("envelope(%s): %v", payload, err)
		}
		if !reflect.DeepEqual(full, cheap) {
			t.Fatalf("envelope(%s) = %+v, full decode = %+v", payload, cheap, full)
		}
		if _, err := envelope(payload, rec.Job, rec.Seq+1); err == nil {
			t.Fatalf("envelope accepted record %d where %d was due", rec.Seq, rec.Seq+1)
		}
	}
}
