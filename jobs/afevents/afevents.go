package afevents

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rte-project/rte/internal/atomicfile"
)

//go:embed af_events.py
var pluginSource []byte

const (
	// EnvFD is the variable that tells the plugin which inherited file descriptor to write
	// events to. Unset or empty, the plugin disables itself.
	EnvFD = "AF_EVENTS_FD"

	// CallbackName is the plugin's name in ANSIBLE_CALLBACKS_ENABLED.
	CallbackName = "af_events"

	// PluginFile is the file Install writes into the plugin directory.
	PluginFile = CallbackName + ".py"

	// MaxResBytes bounds the JSON of one payload value in event_data (res, item, diff, ...);
	// a larger value is replaced by a TruncatedKey marker. Stats counts are never cut this way.
	MaxResBytes = 64 << 10

	// PreviewBytes is how much of a cut value's JSON the marker keeps, as a string.
	PreviewBytes = 4 << 10

	// MaxLineBytes bounds one event line, newline included, so a reader can size its buffer.
	// Only the stats of an inventory of tens of thousands of hosts come near it.
	MaxLineBytes = 4 << 20

	// TruncatedKey marks a payload that was cut: {"_af_truncated": true, "original_bytes": N,
	// "preview": "..."}.
	TruncatedKey = "_af_truncated"

	// Censored is ansible's own notice, the only content of a no_log result: {"censored": Censored}.
	Censored = "the output has been hidden due to the fact that 'no_log: true' was specified for this result"
)

// defaultCallbackPaths are ansible-core's default callback plugin directories. Env keeps them
// after the plugin directory, because ANSIBLE_CALLBACK_PLUGINS replaces the default list and a
// playbook may rely on a callback installed there.
const defaultCallbackPaths = "~/.ansible/plugins/callback:/usr/share/ansible/plugins/callback"

// Install writes the plugin into dir, creating dir with mode 0700 if needed, and returns dir
// as an absolute path for ANSIBLE_CALLBACK_PLUGINS (ansible-playbook runs in each job's own
// directory, so a relative path would not resolve). The file is written to a temporary name,
// synced and renamed, so a run that starts meanwhile reads the old or the new plugin, never a
// partial one. It is mode 0644: the code holds no secret. Install is meant to be called once
// at start; calling it again rewrites the file.
func Install(dir string) (string, error) {
	if dir == "" {
		return "", fmt.Errorf("install af_events plugin: the plugin directory is empty; name a directory the RTE owns")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("install af_events plugin: resolve %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return "", fmt.Errorf("install af_events plugin: create %s: %w", abs, err)
	}
	target := filepath.Join(abs, PluginFile)
	if err := atomicfile.WriteFile(target, pluginSource, 0o644); err != nil {
		return "", fmt.Errorf("install af_events plugin: %w", err)
	}
	return abs, nil
}

// Env returns the environment entries that enable the plugin for one ansible-playbook run:
// the plugin directory (from Install), the enabled callback list, and the descriptor number
// the child inherits the pipe's write end on (with os/exec ExtraFiles, 3 for the first).
//
// Both ANSIBLE_* entries replace what an ansible.cfg says: a caller that must keep other
// enabled callbacks joins their names to CallbackName with commas itself.
func Env(pluginDir string, fd int) []string {
	return []string{
		"ANSIBLE_CALLBACK_PLUGINS=" + pluginDir + ":" + defaultCallbackPaths,
		"ANSIBLE_CALLBACKS_ENABLED=" + CallbackName,
		EnvFD + "=" + strconv.Itoa(fd),
	}
}

// Event is the Go view of one line the plugin writes. EventData stays raw: its fields depend
// on the event, and the app stores and forwards it as it came.
type Event struct {
	Event      string          `json:"event"`
	UUID       string          `json:"uuid"`
	ParentUUID string          `json:"parent_uuid"`
	Counter    int             `json:"counter"`
	Created    time.Time       `json:"created"`
	EventData  json.RawMessage `json:"event_data"`
	// As ansible-runner has them: the text ansible displayed for this event (cut to
	// MaxResBytes), its lines [StartLine, EndLine) in the job's output counted from the first
	// line displayed after the plugin loaded, the job id and ansible-playbook's pid.
	Stdout      string `json:"stdout"`
	StartLine   int    `json:"start_line"`
	EndLine     int    `json:"end_line"`
	RunnerIdent string `json:"runner_ident"`
	PID         int    `json:"pid"`
}

// ParseEvent decodes one line (a trailing newline is allowed) and checks the fields every
// event has: a name, a uuid, a counter from 1, a creation time and an event_data object.
// parent_uuid may be empty (playbook_on_start has none).
func ParseEvent(line []byte) (Event, error) {
	if len(line) > MaxLineBytes {
		return Event{}, fmt.Errorf("event line of %d bytes is over the %d byte limit", len(line), MaxLineBytes)
	}
	var ev Event
	if err := json.Unmarshal(line, &ev); err != nil {
		return Event{}, fmt.Errorf("decode event line: %w", err)
	}
	var problems []string
	if ev.Event == "" {
		problems = append(problems, "event is missing")
	}
	if ev.UUID == "" {
		problems = append(problems, "uuid is missing")
	}
	if ev.Counter < 1 {
		problems = append(problems, fmt.Sprintf("counter is %d, want 1 or more", ev.Counter))
	}
	if ev.Created.IsZero() {
		problems = append(problems, "created is missing")
	}
	if ev.StartLine < 0 || ev.EndLine < ev.StartLine {
		problems = append(problems, fmt.Sprintf("lines %d to %d are no range", ev.StartLine, ev.EndLine))
	}
	var data map[string]json.RawMessage
	if len(ev.EventData) == 0 || json.Unmarshal(ev.EventData, &data) != nil || data == nil {
		problems = append(problems, "event_data is not a JSON object")
	}
	if len(problems) > 0 {
		return Event{}, fmt.Errorf("bad event line (event %.64q, counter %d): %s", ev.Event, ev.Counter, strings.Join(problems, "; "))
	}
	return ev, nil
}
