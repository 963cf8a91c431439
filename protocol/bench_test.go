package protocol_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rte-project/rte/protocol"
)

// benchAt is a fixed record time, so every run encodes the same bytes.
var benchAt = time.Date(2026, 12, 2, 10, 0, 0, 123456789, time.UTC)

// benchOutputRecord is an output record whose text is 64 KiB, the most an output batch holds:
// ansible-like lines with a few characters that JSON must escape.
func benchOutputRecord(b *testing.B) *protocol.Record {
	b.Helper()
	line := "ok: [web01.example.com] => {\"changed\": false, \"msg\": \"All items completed\"}\t<done>\n"
	var sb strings.Builder
	for sb.Len() < 64<<10 {
		sb.WriteString(line)
	}
	text := sb.String()[:64<<10]
	data, err := json.Marshal(protocol.OutputData{Text: text})
	if err != nil {
		b.Fatal(err)
	}
	return &protocol.Record{Job: "1042", Seq: 7, Kind: protocol.KindOutput, At: benchAt, Data: data}
}

// benchEventsRecord is an events record holding 50 ansible-runner shaped runner_on_ok events.
func benchEventsRecord(b *testing.B) *protocol.Record {
	b.Helper()
	events := make([]json.RawMessage, 0, 50)
	for i := range 50 {
		ev := map[string]any{
			"event":       "runner_on_ok",
			"uuid":        fmt.Sprintf("5f0c1d2e-0000-4000-8000-%012d", i),
			"parent_uuid": "5f0c1d2e-0000-4000-8000-999999999999",
			"counter":     i + 10,
			"created":     benchAt.Add(time.Duration(i) * time.Millisecond).Format(time.RFC3339Nano),
			"event_data": map[string]any{
				"play":        "Configure web servers",
				"play_uuid":   "5f0c1d2e-0000-4000-8000-000000000001",
				"task":        "Install nginx",
				"task_uuid":   "5f0c1d2e-0000-4000-8000-000000000002",
				"task_action": "ansible.builtin.package",
				"host":        fmt.Sprintf("web%02d.example.com", i),
				"changed":     i%3 == 0,
				"duration":    0.4 + float64(i)/100,
				"res": map[string]any{
					"changed": i%3 == 0,
					"msg":     "1 package installed",
					"results": []string{"Installed: nginx-1.24.0-1.el9.x86_64"},
					"rc":      0,
				},
			},
		}
		raw, err := json.Marshal(ev)
		if err != nil {
			b.Fatal(err)
		}
		events = append(events, raw)
	}
	data, err := json.Marshal(protocol.EventsData{Events: events})
	if err != nil {
		b.Fatal(err)
	}
	return &protocol.Record{Job: "1042", Seq: 8, Kind: protocol.KindEvents, At: benchAt, Data: data}
}

func benchHello() *protocol.Hello {
	return &protocol.Hello{
		Protocol: protocol.Version, Name: "rte01", Version: "1.2.3", Instance: "rte01-7d9f",
		Mode: protocol.ModeInbound, Files: protocol.FilesTransfer, MaxJobs: 10,
		Running: []string{"1041"}, Spooled: []protocol.SpooledJob{{Job: "1041", LastSeq: 42}},
		TokenFingerprint: "ba78-16bf", AnsibleVersion: "2.14.18",
	}
}

func mustEncode(b *testing.B, m protocol.Message) []byte {
	b.Helper()
	frame, err := protocol.Encode(m)
	if err != nil {
		b.Fatalf("Encode(%T): %v", m, err)
	}
	return frame
}

func BenchmarkDecode(b *testing.B) { benchDecode(b, protocol.Decode) }

// BenchmarkDecodeReference measures the map-first decoder that Decode replaced, so that a
// single run gives the before and after figures on the same machine.
func BenchmarkDecodeReference(b *testing.B) { benchDecode(b, protocol.DecodeReference) }

func benchDecode(b *testing.B, decode func([]byte) (protocol.Message, error)) {
	for _, bc := range []struct {
		name string
		msg  func(*testing.B) protocol.Message
	}{
		{"hello", func(*testing.B) protocol.Message { return benchHello() }},
		{"ack", func(*testing.B) protocol.Message { return &protocol.Ack{Job: "1042", Seq: 7} }},
		{"record_output_64KiB", func(b *testing.B) protocol.Message { return benchOutputRecord(b) }},
		{"record_events_50", func(b *testing.B) protocol.Message { return benchEventsRecord(b) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			frame := mustEncode(b, bc.msg(b))
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := decode(frame); err != nil {
					b.Fatalf("Decode: %v", err)
				}
			}
		})
	}
}

func BenchmarkEncode(b *testing.B) {
	for _, bc := range []struct {
		name string
		rec  func(*testing.B) *protocol.Record
	}{
		{"record_output_64KiB", benchOutputRecord},
		{"record_events_50", benchEventsRecord},
	} {
		b.Run(bc.name, func(b *testing.B) {
			rec := bc.rec(b)
			b.SetBytes(int64(len(mustEncode(b, rec))))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := protocol.Encode(rec); err != nil {
					b.Fatalf("Encode: %v", err)
				}
			}
		})
	}
}
