package summary

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/rte-project/rte/internal/refapp/display"
)

// Summary is what a playbook run did, host by host, built from its af_events events: the
// "Hosts and tasks" view that follows a job's output.
type Summary struct {
	Plays []*Play
	// Recap has one row per host from playbook_on_stats, in host name order; nil when the
	// run ended before ansible printed its recap.
	Recap []HostRecap
	// Warnings are the warning and deprecated events' messages, in order.
	Warnings []string
	// Events is how many events were read; Unreadable how many of them were not event JSON
	// objects and were left out.
	Events, Unreadable int
}

// Play is one play start (a play runs again per serial batch: each batch is its own Play).
type Play struct {
	Name, Pattern string
	Tasks         []*Task
}

// Task is one task or handler start with a row per host that reported a result.
type Task struct {
	Name    string
	Action  string
	Handler bool
	// Duration runs from the task's start to its last host result; zero without results.
	Duration time.Duration
	Hosts    []*HostResult
	// Start is when the task started and Last when its latest host result came; the admin
	// page shows a running task's time from Start.
	Start, Last time.Time
}

// Host results, the words ansible prints.
const (
	ResultOK          = "ok"
	ResultChanged     = "changed"
	ResultFailed      = "failed"
	ResultSkipped     = "skipped"
	ResultUnreachable = "unreachable"
)

// HostResult is one host's outcome of one task.
type HostResult struct {
	Host   string
	Result string // one of the Result constants
	// Ignored is set for a failure that ignore_errors let pass.
	Ignored bool
	// Items counts the loop items reported for the host; 0 for a task without a loop.
	Items int
	// Message says why a host failed or was unreachable, on one line; empty otherwise.
	Message string
	// Duration is how long the host took, as the plugin measured it; zero when unknown.
	Duration time.Duration

	failedItems []string
}

// HostRecap is one host's line of ansible's PLAY RECAP.
type HostRecap struct {
	Host                                                        string
	OK, Changed, Failed, Skipped, Unreachable, Rescued, Ignored int
}

// maxMessage bounds a failure message in the summary: enough for ansible's usual "msg" and
// the first line of stderr, short enough that one noisy module cannot bury the table.
const maxMessage = 300

// maxWarnings bounds the warnings listed; the rest are counted.
const maxWarnings = 20

// Summarize builds the summary of a run from its events in any order (it sorts them by
// counter and drops repeated uuids). An event it cannot read is counted in Unreadable and
// left out: a summary is a reading aid, and the stored events stay the record.
func Summarize(events []json.RawMessage) *Summary {
	s := &Summary{}
	var evs []event
	seen := map[string]bool{}
	for _, raw := range events {
		s.Events++
		var ev event
		if err := json.Unmarshal(raw, &ev); err != nil || ev.Event == "" || ev.Data == nil {
			s.Unreadable++
			continue
		}
		if ev.UUID != "" {
			if seen[ev.UUID] {
				continue
			}
			seen[ev.UUID] = true
		}
		evs = append(evs, ev)
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Counter < evs[j].Counter })

	var (
		play       *Play
		tasks      = map[string]*Task{} // by the task start event's uuid
		tasksByID  = map[string]*Task{} // by ansible's task uuid, the latest start
		warningsIn int
	)
	taskOf := func(ev event) *Task {
		if t := tasks[ev.ParentUUID]; t != nil {
			return t
		}
		return tasksByID[ev.str("task_uuid")]
	}
	for _, ev := range evs {
		switch ev.Event {
		case "playbook_on_play_start":
			play = &Play{Name: ev.str("name"), Pattern: ev.str("pattern")}
			s.Plays = append(s.Plays, play)
		case "playbook_on_task_start", "playbook_on_handler_task_start":
			if play == nil {
				play = &Play{Name: ev.str("play"), Pattern: ev.str("play_pattern")}
				s.Plays = append(s.Plays, play)
			}
			t := &Task{
				Name:    display.OneLine(ev.str("name"), 200),
				Action:  ev.str("task_action"),
				Handler: ev.Event == "playbook_on_handler_task_start",
				Start:   ev.Created,
			}
			if t.Name == "" {
				t.Name = display.OneLine(ev.str("task"), 200)
			}
			play.Tasks = append(play.Tasks, t)
			tasks[ev.UUID] = t
			tasksByID[ev.str("task_uuid")] = t
		case "runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable",
			"runner_on_async_ok", "runner_on_async_failed":
			t := taskOf(ev)
			if t == nil {
				continue
			}
			h := t.host(ev.str("host"))
			h.Result = resultOf(ev)
			h.Ignored = h.Result == ResultFailed && ev.boolean("ignore_errors")
			if d, ok := ev.seconds("duration"); ok {
				h.Duration = d
			}
			if h.Result == ResultFailed || h.Result == ResultUnreachable {
				h.Message = failureMessage(ev.Data["res"], h.failedItems)
			}
			t.saw(ev.Created)
		case "runner_item_on_ok", "runner_item_on_failed", "runner_item_on_skipped":
			t := taskOf(ev)
			if t == nil {
				continue
			}
			h := t.host(ev.str("host"))
			h.Items++
			if ev.Event == "runner_item_on_failed" {
				item := "item " + display.OneLine(jsonText(ev.Data["item"]), 60)
				if m := failureMessage(ev.Data["res"], nil); m != "" {
					item += ": " + m
				}
				h.failedItems = append(h.failedItems, item)
			}
			t.saw(ev.Created)
		case "playbook_on_stats":
			s.Recap = recapOf(ev)
		case "warning", "deprecated":
			warningsIn++
			if len(s.Warnings) < maxWarnings {
				prefix := ""
				if ev.Event == "deprecated" {
					prefix = "deprecated: "
				}
				s.Warnings = append(s.Warnings, prefix+display.OneLine(ev.str("message"), maxMessage))
			}
		}
	}
	if extra := warningsIn - len(s.Warnings); extra > 0 {
		s.Warnings = append(s.Warnings, fmt.Sprintf("... and %d more", extra))
	}
	return s
}

// host returns the task's row for name, adding it in the order hosts first report.
func (t *Task) host(name string) *HostResult {
	for _, h := range t.Hosts {
		if h.Host == name {
			return h
		}
	}
	h := &HostResult{Host: name}
	t.Hosts = append(t.Hosts, h)
	return h
}

func (t *Task) saw(at time.Time) {
	if at.After(t.Last) {
		t.Last = at
	}
	if !t.Start.IsZero() && t.Last.After(t.Start) {
		t.Duration = t.Last.Sub(t.Start)
	}
}

func resultOf(ev event) string {
	switch ev.Event {
	case "runner_on_failed", "runner_on_async_failed":
		return ResultFailed
	case "runner_on_skipped":
		return ResultSkipped
	case "runner_on_unreachable":
		return ResultUnreachable
	}
	if ev.boolean("changed") {
		return ResultChanged
	}
	return ResultOK
}

// failureMessage is what a failed result says: its msg, the exit code, and the first line
// of stderr, on one bounded line. A loop's own msg ("One or more items failed") gives way to
// the items that failed.
func failureMessage(raw json.RawMessage, failedItems []string) string {
	if len(failedItems) > 0 {
		return display.OneLine(strings.Join(failedItems, "; "), maxMessage)
	}
	var res map[string]json.RawMessage
	if json.Unmarshal(raw, &res) != nil || res == nil {
		return ""
	}
	if _, cut := res["_af_truncated"]; cut {
		return "the result was too large to keep; see the output"
	}
	if _, ok := res["censored"]; ok {
		return "hidden: the task has no_log set"
	}
	var parts []string
	if m := jsonText(res["msg"]); m != "" {
		parts = append(parts, m)
	}
	if rc := jsonText(res["rc"]); rc != "" && rc != "0" {
		parts = append(parts, "rc "+rc)
	}
	if se := jsonText(res["stderr"]); se != "" {
		first, _, _ := strings.Cut(strings.TrimSpace(se), "\n")
		parts = append(parts, "stderr: "+first)
	}
	return display.OneLine(strings.Join(parts, "; "), maxMessage)
}

func recapOf(ev event) []HostRecap {
	counts := map[string]*HostRecap{}
	for _, col := range []struct {
		key string
		set func(*HostRecap, int)
	}{
		{"ok", func(r *HostRecap, n int) { r.OK = n }},
		{"changed", func(r *HostRecap, n int) { r.Changed = n }},
		{"failures", func(r *HostRecap, n int) { r.Failed = n }},
		{"dark", func(r *HostRecap, n int) { r.Unreachable = n }},
		{"skipped", func(r *HostRecap, n int) { r.Skipped = n }},
		{"rescued", func(r *HostRecap, n int) { r.Rescued = n }},
		{"ignored", func(r *HostRecap, n int) { r.Ignored = n }},
		{"processed", func(*HostRecap, int) {}},
	} {
		var m map[string]int
		if json.Unmarshal(ev.Data[col.key], &m) != nil {
			continue
		}
		for host, n := range m {
			r := counts[host]
			if r == nil {
				r = &HostRecap{Host: host}
				counts[host] = r
			}
			col.set(r, n)
		}
	}
	out := make([]HostRecap, 0, len(counts))
	for _, r := range counts {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
	return out
}

// WriteText writes the summary as text for a terminal, headed "Hosts and tasks". Every value
// that came from a host is put on one line with control characters removed, so a module's
// output cannot move the cursor or forge lines.
func (s *Summary) WriteText(w io.Writer) error {
	var b bytes.Buffer
	b.WriteString("Hosts and tasks\n")
	if len(s.Plays) == 0 && s.Recap == nil {
		b.WriteString("  (no events: ansible-playbook did not run a play)\n")
	}
	hostWidth, taskWidth := len("HOST"), 0
	for _, p := range s.Plays {
		for _, t := range p.Tasks {
			taskWidth = max(taskWidth, utf8.RuneCountInString(t.Name)+len("HANDLER "))
			for _, h := range t.Hosts {
				hostWidth = max(hostWidth, utf8.RuneCountInString(display.OneLine(h.Host, 80)))
			}
		}
	}
	for _, r := range s.Recap {
		hostWidth = max(hostWidth, utf8.RuneCountInString(display.OneLine(r.Host, 80)))
	}
	for _, p := range s.Plays {
		fmt.Fprintf(&b, "\nPLAY %s", display.OneLine(p.Name, 200))
		if p.Pattern != "" && p.Pattern != p.Name {
			fmt.Fprintf(&b, " [%s]", display.OneLine(p.Pattern, 200))
		}
		b.WriteString("\n")
		if len(p.Tasks) == 0 {
			b.WriteString("  (no tasks ran)\n")
		}
		for _, t := range p.Tasks {
			kind := "TASK"
			if t.Handler {
				kind = "HANDLER"
			}
			head := kind + " " + t.Name
			fmt.Fprintf(&b, "  %s%s  %s\n", head, pad(head, taskWidth), display.Duration(t.Duration))
			if len(t.Hosts) == 0 {
				b.WriteString("      (no host results)\n")
			}
			for _, h := range t.Hosts {
				host := display.OneLine(h.Host, 80)
				fmt.Fprintf(&b, "      %s%s  %-11s  %7s", host, pad(host, hostWidth), h.Result, display.Duration(h.Duration))
				var notes []string
				if h.Items > 0 {
					notes = append(notes, display.Plural(h.Items, "item"))
				}
				if h.Ignored {
					notes = append(notes, "ignored")
				}
				if h.Message != "" {
					notes = append(notes, h.Message)
				}
				if len(notes) > 0 {
					b.WriteString("  " + strings.Join(notes, ", "))
				}
				b.WriteString("\n")
			}
		}
	}
	if s.Recap != nil {
		b.WriteString("\nRECAP\n")
		head := "HOST"
		fmt.Fprintf(&b, "  %s%s  %5s %8s %7s %8s %12s %8s %8s\n", head, pad(head, hostWidth),
			"OK", "CHANGED", "FAILED", "SKIPPED", "UNREACHABLE", "RESCUED", "IGNORED")
		for _, r := range s.Recap {
			host := display.OneLine(r.Host, 80)
			fmt.Fprintf(&b, "  %s%s  %5d %8d %7d %8d %12d %8d %8d\n", host, pad(host, hostWidth),
				r.OK, r.Changed, r.Failed, r.Skipped, r.Unreachable, r.Rescued, r.Ignored)
		}
	}
	if len(s.Warnings) > 0 {
		b.WriteString("\nWARNINGS\n")
		for _, m := range s.Warnings {
			b.WriteString("  " + m + "\n")
		}
	}
	if s.Unreadable > 0 {
		fmt.Fprintf(&b, "\n(%s of %d could not be read and %s left out)\n",
			display.Plural(s.Unreadable, "event"), s.Events, map[bool]string{true: "was", false: "were"}[s.Unreadable == 1])
	}
	_, err := w.Write(b.Bytes())
	return err
}

// event is one af_events line; Data stays a map because the same key means different things
// in different events ("changed" is a flag in a result and a per-host count in the stats).
type event struct {
	Event      string                     `json:"event"`
	UUID       string                     `json:"uuid"`
	ParentUUID string                     `json:"parent_uuid"`
	Counter    int                        `json:"counter"`
	Created    time.Time                  `json:"created"`
	Data       map[string]json.RawMessage `json:"event_data"`
}

func (e event) str(key string) string {
	var s string
	if json.Unmarshal(e.Data[key], &s) != nil {
		return ""
	}
	return s
}

func (e event) boolean(key string) bool {
	var b bool
	return json.Unmarshal(e.Data[key], &b) == nil && b
}

func (e event) seconds(key string) (time.Duration, bool) {
	var f float64
	if json.Unmarshal(e.Data[key], &f) != nil || f < 0 || f > 1e9 {
		return 0, false
	}
	return time.Duration(f * float64(time.Second)), true
}

// jsonText shows a JSON value as text: a string as itself, anything else as compact JSON,
// null or absent as "".
func jsonText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var buf bytes.Buffer
	if json.Compact(&buf, raw) == nil {
		return buf.String()
	}
	return string(raw)
}

func pad(s string, width int) string {
	return strings.Repeat(" ", max(0, width-utf8.RuneCountInString(s)))
}
