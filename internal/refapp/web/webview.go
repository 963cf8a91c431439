package web

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/internal/refapp/api"
	"github.com/rte-project/rte/internal/refapp/display"
	"github.com/rte-project/rte/internal/refapp/summary"
	"github.com/rte-project/rte/protocol"
)

// What the admin page's templates get: the admin API's views with the words and numbers a
// page shows worked out here, so the templates only lay them out.

// webFuncs are the templates' helpers.
var webFuncs = template.FuncMap{
	"runnerPath": func(name string) string { return "/runners/" + url.PathEscape(name) },
	"jobPath":    func(id string) string { return "/jobs/" + url.PathEscape(id) },
	"when":       when,
	"plural":     display.Plural,
}

// when shows a time as an admin compares it with a log line: UTC, to the second.
func when(t any) string {
	var v time.Time
	switch x := t.(type) {
	case time.Time:
		v = x
	case *time.Time:
		if x != nil {
			v = *x
		}
	}
	if v.IsZero() {
		return "—"
	}
	return v.UTC().Format("2006-01-02 15:04:05") + " UTC"
}

// ago shows how long ago t was, coarsely; "never" for the zero time.
func ago(now time.Time, t *time.Time) string {
	if t == nil || t.IsZero() {
		return "never"
	}
	d := now.Sub(*t)
	switch {
	case d < 5*time.Second:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%d s ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%d min ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h ago", int(d.Hours()))
	}
	return fmt.Sprintf("%d days ago", int(d.Hours()/24))
}

// webRunner is a runner as the pages show it.
type webRunner struct {
	api.RunnerView
	// RequestIP is the address the last registration came from, RequestPort its port.
	RequestIP, RequestPort string
	// URLHost is the host the app dials (RTE_URL's host).
	URLHost string
	// Waiting: the runner waits for an admin; CertChanged: it was approved before and its
	// certificate changed, so the page shows the pinned one beside the new one.
	Waiting, CertChanged bool
	// Jobs is "running of max" from the live socket, else the runner page's override.
	Jobs        string
	LastSeenAgo string
}

func newWebRunner(r *app.Runner, st app.RunnerStatus, live bool, now time.Time) webRunner {
	v := webRunner{RunnerView: api.NewRunnerView(r, st, live)}
	v.RequestIP, v.RequestPort = r.RemoteAddr, ""
	if host, port, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		v.RequestIP, v.RequestPort = host, port
	}
	if u, err := url.Parse(r.URL); err == nil {
		v.URLHost = u.Host
	}
	v.Waiting = r.State == app.StateWaiting
	v.CertChanged = r.Certificate != nil && r.PendingCertificate != nil
	switch {
	case v.Capacity != nil && v.Capacity.MaxJobs > 0:
		v.Jobs = fmt.Sprintf("%d of %d", v.Capacity.Running, v.Capacity.MaxJobs)
	case v.Capacity != nil:
		v.Jobs = fmt.Sprintf("%d, no limit", v.Capacity.Running)
	case r.MaxJobs > 0:
		v.Jobs = fmt.Sprintf("— of %d", r.MaxJobs)
	default:
		v.Jobs = "—"
	}
	if v.Capacity != nil && v.Capacity.Draining {
		v.Jobs += ", draining"
	}
	v.LastSeenAgo = ago(now, v.LastSeen)
	return v
}

// webJob is a job as the pages show it.
type webJob struct {
	api.JobView
	Ended bool
	// StateText is the status once ended, else the state; StateClass picks its badge colour.
	StateText, StateClass string
	Took                  string // from start (or creation) to end, or until now while running
	ExtravarsText         string // indented JSON
}

func newWebJob(j *app.Job, now time.Time) webJob {
	v := webJob{JobView: api.NewJobView(j), Ended: j.State == app.JobEnded}
	v.StateText, v.StateClass = string(j.State), "state-"+string(j.State)
	if v.Ended {
		v.StateText, v.StateClass = j.Status, "status-"+j.Status
	}
	from := j.StartedAt
	if from.IsZero() {
		from = j.CreatedAt
	}
	switch {
	case v.Ended && !j.EndedAt.IsZero():
		v.Took = display.Duration(j.EndedAt.Sub(from))
	case !v.Ended && !j.StartedAt.IsZero():
		v.Took = display.Duration(now.Sub(j.StartedAt)) + " so far"
	default:
		v.Took = "—"
	}
	if len(j.Start.Extravars) > 0 {
		var buf bytes.Buffer
		if json.Indent(&buf, j.Start.Extravars, "", "  ") == nil {
			v.ExtravarsText = buf.String()
		} else {
			v.ExtravarsText = string(j.Start.Extravars)
		}
	}
	return v
}

// outputPiece is a run of the job's output, or a note from the RTE (its start, a log line),
// shown apart from ansible's own text.
type outputPiece struct {
	Text  string
	Note  bool
	Level string // a note's level: info, warn, error
}

// pieceOf turns one record into what the output shows; ok is false for records that show
// nothing there (events, end).
func pieceOf(rec protocol.Record) (outputPiece, bool) {
	switch rec.Kind {
	case protocol.KindOutput:
		var d protocol.OutputData
		if json.Unmarshal(rec.Data, &d) == nil && d.Text != "" {
			return outputPiece{Text: d.Text}, true
		}
	case protocol.KindStart:
		var d protocol.StartData
		if json.Unmarshal(rec.Data, &d) == nil {
			return outputPiece{Note: true, Level: protocol.LevelInfo,
				Text: fmt.Sprintf("rte: %s started on %s (pid %d)\n", display.OneLine(d.Playbook, 200), display.OneLine(d.Instance, 100), d.PID)}, true
		}
	case protocol.KindLog:
		var d protocol.LogData
		if json.Unmarshal(rec.Data, &d) == nil {
			return outputPiece{Note: true, Level: display.OneLine(d.Level, 10), Text: "rte " + display.OneLine(d.Level, 10) + ": " + display.OneLine(d.Message, 1000) + "\n"}, true
		}
	}
	return outputPiece{}, false
}

// outputTail keeps the last max bytes of a job's output pieces.
type outputTail struct {
	pieces []outputPiece
	size   int
	max    int
	cut    bool // earlier output was left out
}

func (o *outputTail) add(p outputPiece) {
	o.pieces = append(o.pieces, p)
	o.size += len(p.Text)
	for o.size > o.max && len(o.pieces) > 0 {
		first := &o.pieces[0]
		over := o.size - o.max
		o.cut = true
		if len(first.Text) <= over {
			o.size -= len(first.Text)
			o.pieces = o.pieces[1:]
			continue
		}
		// Cut inside the first piece, at a line start where there is one, so the tail
		// does not begin mid-line.
		for over < len(first.Text) && !utf8.RuneStart(first.Text[over]) {
			over++
		}
		rest := first.Text[over:]
		if i := strings.IndexByte(rest, '\n'); i >= 0 {
			rest = rest[i+1:]
		}
		o.size -= len(first.Text) - len(rest)
		if rest == "" {
			o.pieces = o.pieces[1:]
			continue
		}
		first.Text = rest
	}
}

// summaryView is the "Hosts and tasks" view: the summary with each task placed on a
// timeline, so a slow task stands out at a glance.
type summaryView struct {
	Plays      []playView
	Recap      []summary.HostRecap
	Warnings   []string
	Events     int // events read
	Unreadable int // events that could not be read and were left out
	// Slowest names the longest task when the run has several; empty otherwise.
	Slowest     string
	SlowestTook string
	SlowestPct  int
	// Span is the time from the first task's start to the last result seen.
	Span string
}

type playView struct {
	Name, Pattern string
	Tasks         []taskView
}

type taskView struct {
	*summary.Task
	Took    string
	Counts  string // "2 ok, 1 changed"
	Slow    bool
	Running bool // the task running now: no host has reported yet
	// X and W place the task's bar on a 0..1000 timeline.
	X, W  string
	Hosts []hostView
}

type hostView struct {
	*summary.HostResult
	Took  string
	Notes string
	X, W  string
}

// newSummaryView lays the summary on a timeline from the first task's start to the last
// result seen. For a job still running, now is the present: the last task, if no host has
// reported on it yet, is the one running, and its bar grows until now. For an ended job now
// is zero, and such a task simply has no result.
func newSummaryView(s *summary.Summary, now time.Time) summaryView {
	v := summaryView{Recap: s.Recap, Warnings: s.Warnings, Events: s.Events, Unreadable: s.Unreadable}
	var running *summary.Task
	if n := len(s.Plays); n > 0 && !now.IsZero() {
		if tasks := s.Plays[n-1].Tasks; len(tasks) > 0 && len(tasks[len(tasks)-1].Hosts) == 0 {
			running = tasks[len(tasks)-1]
		}
	}
	// took is how long a task ran: to its last result, or to now for the running one.
	took := func(t *summary.Task) time.Duration {
		if t == running && !t.Start.IsZero() && now.After(t.Start) {
			return now.Sub(t.Start)
		}
		return t.Duration
	}
	var first, last time.Time
	var slowest *summary.Task
	tasks := 0
	for _, p := range s.Plays {
		for _, t := range p.Tasks {
			tasks++
			if !t.Start.IsZero() && (first.IsZero() || t.Start.Before(first)) {
				first = t.Start
			}
			for _, end := range []time.Time{t.Start, t.Last, t.Start.Add(took(t))} {
				if end.After(last) {
					last = end
				}
			}
			if slowest == nil || took(t) > took(slowest) {
				slowest = t
			}
		}
	}
	span := last.Sub(first)
	if first.IsZero() || span <= 0 {
		span = 0
	}
	pos := func(d time.Duration) float64 {
		if span <= 0 {
			return 0
		}
		return min(1000, max(0, float64(d)/float64(span)*1000))
	}
	num := func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }
	if span > 0 {
		v.Span = display.Duration(span)
	}
	if tasks > 1 && slowest != nil && took(slowest) > 0 && span > 0 {
		v.Slowest, v.SlowestTook = slowest.Name, display.Duration(took(slowest))
		v.SlowestPct = int(float64(took(slowest)) / float64(span) * 100)
		if slowest == running {
			v.SlowestTook += " so far"
		}
	}
	for _, p := range s.Plays {
		pv := playView{Name: display.OneLine(p.Name, 200), Pattern: display.OneLine(p.Pattern, 200)}
		for _, t := range p.Tasks {
			x := 0.0
			if !t.Start.IsZero() && !first.IsZero() {
				x = pos(t.Start.Sub(first))
			}
			// A bar at least a sliver wide, so a task that took no time still shows where it ran.
			w := min(max(pos(took(t)), 3), 1000-x)
			tv := taskView{Task: t, Took: display.Duration(took(t)), Slow: t == slowest && v.Slowest != "",
				X: num(x), W: num(w), Counts: resultCounts(t.Hosts), Running: t == running}
			if tv.Running {
				tv.Counts = "running"
			}
			for _, h := range t.Hosts {
				hw := min(max(pos(h.Duration), 3), 1000-x)
				tv.Hosts = append(tv.Hosts, hostView{HostResult: h, Took: display.Duration(h.Duration), Notes: hostNotes(h), X: num(x), W: num(hw)})
			}
			pv.Tasks = append(pv.Tasks, tv)
		}
		v.Plays = append(v.Plays, pv)
	}
	return v
}

// resultCounts says how a task went across its hosts, in ansible's order of severity.
func resultCounts(hosts []*summary.HostResult) string {
	n := map[string]int{}
	for _, h := range hosts {
		n[h.Result]++
	}
	var parts []string
	for _, r := range []string{summary.ResultFailed, summary.ResultUnreachable, summary.ResultChanged, summary.ResultOK, summary.ResultSkipped} {
		if n[r] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n[r], r))
		}
	}
	if len(parts) == 0 {
		return "no result"
	}
	return strings.Join(parts, ", ")
}

func hostNotes(h *summary.HostResult) string {
	var notes []string
	if h.Items > 0 {
		notes = append(notes, display.Plural(h.Items, "item"))
	}
	if h.Ignored {
		notes = append(notes, "failure ignored")
	}
	if h.Message != "" {
		notes = append(notes, h.Message)
	}
	return strings.Join(notes, " · ")
}
