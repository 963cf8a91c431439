package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestJSONLinesHaveTheSharedKeys(t *testing.T) {
	var buf bytes.Buffer
	log, err := New("info", "json", &buf)
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("hidden")
	log.Info("shown")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("want one line (debug below info), got %q", buf.String())
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"time", "level", "msg"} {
		if _, ok := m[k]; !ok {
			t.Errorf("line %s has no %q", lines[0], k)
		}
	}
}

func TestConsoleAndBadLevel(t *testing.T) {
	var buf bytes.Buffer
	log, err := New("debug", "console", &buf)
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("x")
	if !strings.Contains(buf.String(), "DEBUG") {
		t.Errorf("console line %q has no capitalised level", buf.String())
	}
	if _, err := New("loud", "json", &buf); err == nil || !strings.Contains(err.Error(), "loud") {
		t.Errorf("level loud: want an error naming it, got %v", err)
	}
}
