package summary

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"unicode"
)

// FuzzSummarize feeds events as a runner (and the hosts behind it) may send them: the summary
// must never panic, and its text must stay free of control characters but the line ends.
func FuzzSummarize(f *testing.F) {
	// Short seeds: the fuzzer minimises each new input, which takes long on a whole stream.
	for _, path := range []string{"testdata/site.events.jsonl", "testdata/failures.events.jsonl"} {
		lines := bytes.SplitAfter(readFileForFuzz(f, path), []byte("\n"))
		f.Add(bytes.Join(lines[:min(6, len(lines))], nil))
		f.Add(lines[len(lines)-2])
	}
	f.Add([]byte(`{"event":"runner_on_failed","uuid":"a","parent_uuid":"b","counter":1,"event_data":{"host":"\u001b[2J","res":{"msg":[1,{"x":null}],"rc":"7","stderr":"\r\nx"}}}`))
	f.Add([]byte(`{"event":"playbook_on_stats","event_data":{"ok":{"h":"many"},"dark":[],"failures":{"h":1e99}}}`))
	f.Fuzz(func(t *testing.T, stream []byte) {
		var events []json.RawMessage
		for _, line := range bytes.Split(stream, []byte("\n")) {
			events = append(events, json.RawMessage(line))
		}
		s := Summarize(events)
		var out bytes.Buffer
		if err := s.WriteText(&out); err != nil {
			t.Fatal(err)
		}
		if i := strings.IndexFunc(out.String(), func(r rune) bool { return unicode.IsControl(r) && r != '\n' }); i >= 0 {
			t.Fatalf("control character in the summary at %d: %q", i, out.String())
		}
	})
}

func readFileForFuzz(f *testing.F, path string) []byte {
	b, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	return b
}
