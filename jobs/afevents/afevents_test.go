package afevents_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rte-project/rte/jobs/afevents"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// canary is the no_log secret in testdata/main.yml; it must never reach the events.
const canary = "canary-5f1c2a9e-do-not-leak"

// ansibleRun is what one real ansible-playbook run produced.
type ansibleRun struct {
	raw      []byte // everything written to the events pipe
	events   []afevents.Event
	data     []map[string]json.RawMessage // events[i].EventData decoded one level
	stdout   string
	stderr   string
	exitCode int
}

func requireAnsible(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the plugin tests run the real ansible-playbook")
	}
	path, err := exec.LookPath("ansible-playbook")
	if err != nil {
		t.Skip("ansible-playbook is not in PATH; install Debian's ansible-core (apt-get install -y ansible-core) to run the plugin tests")
	}
	return path
}

// runPlaybook runs the real ansible-playbook on a playbook from testdata with the plugin
// installed in a temporary directory and its events on a pipe passed as fd 3.
func runPlaybook(t *testing.T, playbook, inventory string, extraEnv ...string) ansibleRun {
	t.Helper()
	return runPlaybookOutput(t, false, playbook, inventory, extraEnv...)
}

// runPlaybookOutput is runPlaybook; with combined, stdout and stderr share one pipe, as in the
// RTE, so ansibleRun.stdout is the job's output in the order it was written.
func runPlaybookOutput(t *testing.T, combined bool, playbook, inventory string, extraEnv ...string) ansibleRun {
	t.Helper()
	bin := requireAnsible(t)
	work := t.TempDir()
	pluginDir, err := afevents.Install(filepath.Join(work, "plugins"))
	if err != nil {
		t.Fatalf("Install: %v", err)
	}
	invPath := filepath.Join(work, "hosts.ini")
	cfgPath := filepath.Join(work, "ansible.cfg")
	for path, text := range map[string]string{invPath: inventory, cfgPath: "[defaults]\n"} {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pbPath, err := filepath.Abs(filepath.Join("testdata", playbook))
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-i", invPath, pbPath)
	cmd.Dir = work
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + filepath.Join(work, "home"),
		"LANG=C.UTF-8",
		"ANSIBLE_CONFIG=" + cfgPath,
		"ANSIBLE_LOCAL_TEMP=" + filepath.Join(work, "local-tmp"),
		"ANSIBLE_REMOTE_TEMP=" + filepath.Join(work, "remote-tmp"),
		"ANSIBLE_NOCOLOR=1",
		"PYTHONDONTWRITEBYTECODE=1", // keeps __pycache__ out of testdata/action_plugins
	}, afevents.Env(pluginDir, 3)...)
	cmd.Env = append(cmd.Env, extraEnv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if combined {
		cmd.Stderr = &stdout // the same writer: os/exec gives the child one pipe for both
	}

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd.ExtraFiles = []*os.File{w}
	if err := cmd.Start(); err != nil {
		w.Close()
		t.Fatalf("start ansible-playbook: %v", err)
	}
	w.Close() // the child holds the only write end now, so EOF means every writer is gone

	type readResult struct {
		b   []byte
		err error
	}
	read := make(chan readResult, 1)
	go func() {
		b, err := io.ReadAll(r)
		read <- readResult{b, err}
	}()

	waitErr := cmd.Wait()
	exitCode := 0
	var exitErr *exec.ExitError
	switch {
	case errors.As(waitErr, &exitErr):
		exitCode = exitErr.ExitCode()
	case waitErr != nil:
		t.Fatalf("ansible-playbook: %v\nstderr:\n%s", waitErr, stderr.String())
	}

	var got readResult
	select {
	case got = <-read:
	case <-time.After(30 * time.Second):
		r.Close() // unblocks the reader so it can exit
		<-read
		t.Fatal("events pipe still open 30 s after ansible-playbook exited: a child process inherited fd 3")
	}
	if got.err != nil {
		t.Fatalf("read events pipe: %v", got.err)
	}

	run := ansibleRun{raw: got.b, stdout: stdout.String(), stderr: stderr.String(), exitCode: exitCode}
	if len(run.raw) == 0 {
		t.Fatalf("no events on fd 3; stderr:\n%s", run.stderr)
	}
	if run.raw[len(run.raw)-1] != '\n' {
		t.Fatalf("events output does not end with a newline: last line %q", lastLine(run.raw))
	}
	sc := bufio.NewScanner(bytes.NewReader(run.raw))
	sc.Buffer(make([]byte, 0, 64<<10), afevents.MaxLineBytes)
	for sc.Scan() {
		ev, err := afevents.ParseEvent(sc.Bytes())
		if err != nil {
			t.Fatalf("line %d is not a valid event: %v\nline: %.300s", len(run.events)+1, err, sc.Bytes())
		}
		var data map[string]json.RawMessage
		if err := json.Unmarshal(ev.EventData, &data); err != nil {
			t.Fatalf("event %d event_data: %v", ev.Counter, err)
		}
		run.events = append(run.events, ev)
		run.data = append(run.data, data)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("scan events: %v", err)
	}
	return run
}

func lastLine(b []byte) []byte {
	b = bytes.TrimRight(b, "\n")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	if len(b) > 200 {
		b = b[:200]
	}
	return b
}

// str returns event_data[key] as a string, or "" when it is absent or not a string.
func (r ansibleRun) str(i int, key string) string {
	var s string
	_ = json.Unmarshal(r.data[i][key], &s)
	return s
}

func (r ansibleRun) field(t *testing.T, i int, key string, v any) {
	t.Helper()
	raw, ok := r.data[i][key]
	if !ok {
		t.Fatalf("%s event (counter %d) has no event_data.%s; has %v", r.events[i].Event, r.events[i].Counter, key, keys(r.data[i]))
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s event (counter %d) event_data.%s = %s: %v", r.events[i].Event, r.events[i].Counter, key, raw, err)
	}
}

func keys(m map[string]json.RawMessage) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// find returns the indexes of the events named event whose event_data.task is task ("" for any).
func (r ansibleRun) find(event, task string) []int {
	var idx []int
	for i, ev := range r.events {
		if ev.Event == event && (task == "" || r.str(i, "task") == task) {
			idx = append(idx, i)
		}
	}
	return idx
}

// one returns the index of the only event named event for task.
func (r ansibleRun) one(t *testing.T, event, task string) int {
	t.Helper()
	idx := r.find(event, task)
	if len(idx) != 1 {
		t.Fatalf("want exactly one %s event for task %q, got %d; events: %s", event, task, len(idx), r.names())
	}
	return idx[0]
}

func (r ansibleRun) names() string {
	var b strings.Builder
	for i, ev := range r.events {
		b.WriteString("\n  " + strconv.Itoa(ev.Counter) + " " + ev.Event)
		if task := r.str(i, "task"); task != "" {
			b.WriteString(" [" + task + "]")
		}
	}
	return b.String()
}

// checkStream checks what every run must satisfy: counters 1..N, unique uuids, parent links
// task -> play -> playbook, stats last.
func checkStream(t *testing.T, r ansibleRun) {
	t.Helper()
	byUUID := map[string]int{}
	for i, ev := range r.events {
		if ev.Counter != i+1 {
			t.Fatalf("event %d (%s) has counter %d, want %d: counters must be 1, 2, 3... in order", i+1, ev.Event, ev.Counter, i+1)
		}
		if j, dup := byUUID[ev.UUID]; dup {
			t.Fatalf("uuid %s is used by event %d (%s) and event %d (%s)", ev.UUID, j+1, r.events[j].Event, i+1, ev.Event)
		}
		byUUID[ev.UUID] = i
	}
	parentOf := func(i int) (afevents.Event, int) {
		j, ok := byUUID[r.events[i].ParentUUID]
		if !ok {
			t.Fatalf("%s (counter %d) has parent_uuid %q, which is no earlier event's uuid", r.events[i].Event, r.events[i].Counter, r.events[i].ParentUUID)
		}
		if j >= i {
			t.Fatalf("%s (counter %d) has a parent that comes later (counter %d)", r.events[i].Event, r.events[i].Counter, r.events[j].Counter)
		}
		return r.events[j], j
	}
	for i, ev := range r.events {
		switch {
		case ev.Event == "playbook_on_start":
			if ev.ParentUUID != "" {
				t.Errorf("playbook_on_start has parent_uuid %q, want none", ev.ParentUUID)
			}
			if got := r.str(i, "playbook_uuid"); got != ev.UUID {
				t.Errorf("playbook_on_start uuid %s but event_data.playbook_uuid %s", ev.UUID, got)
			}
		case ev.Event == "playbook_on_play_start", ev.Event == "playbook_on_stats":
			if p, _ := parentOf(i); p.Event != "playbook_on_start" {
				t.Errorf("%s (counter %d) has parent %s, want playbook_on_start", ev.Event, ev.Counter, p.Event)
			}
		case ev.Event == "playbook_on_task_start", ev.Event == "playbook_on_handler_task_start":
			if p, _ := parentOf(i); p.Event != "playbook_on_play_start" {
				t.Errorf("%s [%s] has parent %s, want playbook_on_play_start", ev.Event, r.str(i, "task"), p.Event)
			}
		case strings.HasPrefix(ev.Event, "runner_"):
			p, j := parentOf(i)
			if p.Event != "playbook_on_task_start" && p.Event != "playbook_on_handler_task_start" {
				t.Errorf("%s [%s] has parent %s, want its task's start event", ev.Event, r.str(i, "task"), p.Event)
			}
			if got, want := r.str(i, "task_uuid"), r.str(j, "task_uuid"); got != want {
				t.Errorf("%s has task_uuid %s but its parent task start has %s", ev.Event, got, want)
			}
		}
	}
	if last := r.events[len(r.events)-1].Event; last != "playbook_on_stats" {
		t.Errorf("last event is %s, want playbook_on_stats; events: %s", last, r.names())
	}
	if strings.Contains(r.stdout, "playbook_on_") || strings.Contains(r.stdout, `"counter"`) {
		t.Errorf("event lines leaked into ansible's stdout:\n%s", r.stdout)
	}
}

func TestPlaybookEvents(t *testing.T) {
	t.Parallel()
	r := runPlaybook(t, "main.yml",
		"local ansible_connection=local ansible_python_interpreter=/usr/bin/python3\n",
		"ANSIBLE_STDOUT_CALLBACK=default")
	if r.exitCode != 2 {
		t.Fatalf("ansible-playbook exit code %d, want 2 (one host failed)\nstderr:\n%s", r.exitCode, r.stderr)
	}
	checkStream(t, r)

	t.Run("sequence", func(t *testing.T) {
		want := []string{"playbook_on_start", "playbook_on_play_start", "playbook_on_task_start", "runner_on_start", "runner_on_ok"}
		var got []string
		for _, ev := range r.events[:min(len(want), len(r.events))] {
			got = append(got, ev.Event)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("first events %v, want %v", got, want)
		}
		if task := r.str(2, "task"); task != "say hello" {
			t.Errorf("first task start is for %q, want \"say hello\"", task)
		}
		if play := r.str(1, "play"); play != "main play" {
			t.Errorf("play start names play %q, want \"main play\"", play)
		}
		if pb := r.str(0, "playbook"); !strings.HasSuffix(pb, "main.yml") {
			t.Errorf("playbook_on_start names playbook %q, want the path of main.yml", pb)
		}
	})

	t.Run("ok", func(t *testing.T) {
		i := r.one(t, "runner_on_ok", "say hello")
		var changed bool
		var res struct{ Msg string }
		var duration float64
		var start, end time.Time
		r.field(t, i, "changed", &changed)
		r.field(t, i, "res", &res)
		r.field(t, i, "duration", &duration)
		r.field(t, i, "start", &start)
		r.field(t, i, "end", &end)
		if changed || res.Msg != "hello" {
			t.Errorf("say hello: changed=%v res.msg=%q, want false and \"hello\"", changed, res.Msg)
		}
		if duration < 0 || end.Before(start) {
			t.Errorf("say hello: start %v end %v duration %v, want end >= start and duration >= 0", start, end, duration)
		}
		if host, addr := r.str(i, "host"), r.str(i, "remote_addr"); host != "local" || addr != "local" {
			t.Errorf("say hello: host %q remote_addr %q, want \"local\" for both", host, addr)
		}
		if action := r.str(i, "task_action"); action != "ansible.builtin.debug" {
			t.Errorf("say hello: task_action %q, want ansible.builtin.debug", action)
		}
		if args := r.str(i, "task_args"); args != "" {
			t.Errorf("task_args = %q, want empty: arguments may hold secrets", args)
		}

		var changedCmd bool
		r.field(t, r.one(t, "runner_on_ok", "change something"), "changed", &changedCmd)
		if !changedCmd {
			t.Error("change something: runner_on_ok has changed=false, want true")
		}
	})

	t.Run("handler", func(t *testing.T) {
		n := r.one(t, "playbook_on_notify", "change something")
		if h := r.str(n, "handler"); h != "on change" {
			t.Errorf("playbook_on_notify names handler %q, want \"on change\"", h)
		}
		r.one(t, "playbook_on_handler_task_start", "on change")
		r.one(t, "runner_on_ok", "on change")
	})

	t.Run("failed", func(t *testing.T) {
		var ignored, notIgnored bool
		r.field(t, r.one(t, "runner_on_failed", "fail but ignored"), "ignore_errors", &ignored)
		r.field(t, r.one(t, "runner_on_failed", "final failure"), "ignore_errors", &notIgnored)
		if !ignored || notIgnored {
			t.Errorf("ignore_errors: %v for the ignored failure and %v for the real one, want true and false", ignored, notIgnored)
		}
	})

	t.Run("skipped", func(t *testing.T) {
		r.one(t, "runner_on_skipped", "skip me")
		if n := len(r.find("runner_on_ok", "skip me")); n != 0 {
			t.Errorf("skipped task also has %d runner_on_ok events", n)
		}
	})

	t.Run("loop", func(t *testing.T) {
		var items []string
		for _, i := range r.find("runner_item_on_ok", "loop items") {
			var item string
			r.field(t, i, "item", &item)
			items = append(items, item)
		}
		if want := []string{"a", "b", "c"}; !slices.Equal(items, want) {
			t.Errorf("runner_item_on_ok items %v, want %v", items, want)
		}
		r.one(t, "runner_on_ok", "loop items")
	})

	t.Run("no_log", func(t *testing.T) {
		if bytes.Contains(r.raw, []byte(canary)) {
			t.Fatalf("the no_log secret appears in the events output at byte %d", bytes.Index(r.raw, []byte(canary)))
		}
		censored := map[string]any{"censored": afevents.Censored}
		var res map[string]any
		r.field(t, r.one(t, "runner_on_ok", "hidden command"), "res", &res)
		if !mapsEqual(res, censored) {
			t.Errorf("hidden command res = %v, want only %v", res, censored)
		}

		items := r.find("runner_item_on_ok", "hidden loop")
		if len(items) != 2 {
			t.Fatalf("hidden loop: %d runner_item_on_ok events, want 2", len(items))
		}
		var public struct{ Msg string }
		r.field(t, items[0], "res", &public)
		if public.Msg != "value public" {
			t.Errorf("hidden loop: the public item's res.msg is %q, want \"value public\" (only no_log items are censored)", public.Msg)
		}
		var hiddenRes map[string]any
		r.field(t, items[1], "res", &hiddenRes)
		if !mapsEqual(hiddenRes, censored) {
			t.Errorf("hidden loop: the no_log item's res = %v, want only %v", hiddenRes, censored)
		}
		if item := string(r.data[items[1]]["item"]); item != "null" {
			t.Errorf("hidden loop: the no_log item event has item %s, want null", item)
		}
	})

	t.Run("truncated", func(t *testing.T) {
		i := r.one(t, "runner_on_ok", "big result")
		var res map[string]any
		r.field(t, i, "res", &res)
		if res[afevents.TruncatedKey] != true {
			t.Fatalf("big result res has keys %v, want the %s marker", mapKeys(res), afevents.TruncatedKey)
		}
		orig, _ := res["original_bytes"].(float64)
		preview, _ := res["preview"].(string)
		if orig <= afevents.MaxResBytes || len(preview) == 0 || len(preview) > afevents.PreviewBytes || !strings.HasPrefix(preview, `{"ansible_facts"`) {
			t.Errorf("big result marker: original_bytes %v (want > %d), preview of %d bytes starting %.40q (want 1..%d bytes of the result's JSON)",
				orig, afevents.MaxResBytes, len(preview), preview, afevents.PreviewBytes)
		}
		if size := len(r.data[i]["res"]); size > 2*afevents.PreviewBytes {
			t.Errorf("truncated res is still %d bytes", size)
		}
	})

	t.Run("odd values", func(t *testing.T) {
		i := r.one(t, "runner_on_ok", "odd values")
		var res struct {
			Raw      string
			Tags     []string
			When     string
			NaN      *float64          `json:"nan"`
			TupleKey map[string]string `json:"tuple_key"`
		}
		r.field(t, i, "res", &res)
		slices.Sort(res.Tags)
		if res.Raw != "\uFFFDbytes" || !slices.Equal(res.Tags, []string{"a", "b"}) || res.When != "2024-01-02T03:04:05" || res.NaN != nil {
			t.Errorf("odd values res: raw %q tags %v when %q nan %v; want \"\\uFFFDbytes\", [a b], \"2024-01-02T03:04:05\", null", res.Raw, res.Tags, res.When, res.NaN)
		}
		if len(res.TupleKey) != 1 || !slices.Contains(mapValues(res.TupleKey), "pair") {
			t.Errorf("odd values res.tuple_key = %v, want one entry with value \"pair\"", res.TupleKey)
		}

		start := r.one(t, "playbook_on_task_start", "odd values")
		var warned, deprecated bool
		for j, ev := range r.events {
			switch {
			case ev.Event == "warning" && r.str(j, "message") == "af odd values warning":
				warned = true
			case ev.Event == "deprecated" && r.str(j, "message") == "af odd values deprecation":
				deprecated = true
				if v := r.str(j, "version"); v != "99.0" {
					t.Errorf("deprecated event version %q, want 99.0", v)
				}
			default:
				continue
			}
			if ev.ParentUUID != r.events[start].UUID {
				t.Errorf("%s event's parent is %s, want the odd values task start %s", ev.Event, ev.ParentUUID, r.events[start].UUID)
			}
		}
		if !warned || !deprecated {
			t.Errorf("warning event seen: %v, deprecated event seen: %v; want both; events: %s", warned, deprecated, r.names())
		}
		for j, ev := range r.events {
			if ev.Event == "warning" && r.str(j, "source") == "af_events" {
				t.Errorf("the plugin reported its own failure: %s", r.str(j, "message"))
			}
		}
	})

	t.Run("stats", func(t *testing.T) {
		i := r.one(t, "playbook_on_stats", "")
		want := map[string]int{"ok": 9, "changed": 2, "failures": 1, "dark": 0, "skipped": 1, "rescued": 0, "ignored": 1, "processed": 1}
		got := statsFor(t, r, i, "local")
		if !mapsEqual(got, want) {
			t.Errorf("stats for local = %v, want %v", got, want)
		}
		// The recap ansible prints must say the same.
		m := regexp.MustCompile(`local\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)\s+rescued=(\d+)\s+ignored=(\d+)`).FindStringSubmatch(r.stdout)
		if m == nil {
			t.Fatalf("no PLAY RECAP line for local in stdout:\n%s", r.stdout)
		}
		recap := map[string]int{}
		for k, name := range []string{"ok", "changed", "dark", "failures", "skipped", "rescued", "ignored"} {
			recap[name], _ = strconv.Atoi(m[k+1])
		}
		recap["processed"] = 1
		if !mapsEqual(got, recap) {
			t.Errorf("stats event %v disagrees with ansible's recap %v", got, recap)
		}
	})

	t.Run("stdout", func(t *testing.T) {
		for _, want := range []string{"PLAY [main play]", "TASK [say hello]", "PLAY RECAP"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
			}
		}
	})
}

// TestUnreachableHostOnelineStdout runs the plugin beside a stdout callback other than default:
// oneline, which ships with ansible-core (the json one lives in the ansible.posix collection,
// which Debian's ansible-core does not carry). Its stdout is one line per host result and
// nothing else, so any byte the plugin wrote to stdout would show.
func TestUnreachableHostOnelineStdout(t *testing.T) {
	t.Parallel()
	// Port 1 on loopback refuses the connection, so the host is unreachable at once. Host key
	// checking is off for this run only, as the refused host has no key to check.
	r := runPlaybook(t, "unreachable.yml",
		"dead ansible_host=127.0.0.1 ansible_port=1 ansible_connection=ssh ansible_user=rte-test ansible_python_interpreter=/usr/bin/python3\n"+
			"[batch]\nb1 ansible_connection=local ansible_python_interpreter=/usr/bin/python3\nb2 ansible_connection=local ansible_python_interpreter=/usr/bin/python3\n",
		"ANSIBLE_STDOUT_CALLBACK=oneline", "ANSIBLE_HOST_KEY_CHECKING=False")
	if r.exitCode != 4 {
		t.Fatalf("ansible-playbook exit code %d, want 4 (host unreachable)\nstderr:\n%s", r.exitCode, r.stderr)
	}
	checkStream(t, r)

	// stdout must be exactly oneline's lines, one per host result in the events' order.
	var want []string
	for i, ev := range r.events {
		switch ev.Event {
		case "runner_on_ok":
			want = append(want, r.str(i, "host")+" | SUCCESS => ")
		case "runner_on_unreachable":
			var res struct{ Msg string }
			r.field(t, i, "res", &res)
			want = append(want, r.str(i, "host")+" | UNREACHABLE!: "+res.Msg)
		case "runner_on_failed", "runner_on_skipped":
			t.Fatalf("unexpected %s [%s]; events: %s", ev.Event, r.str(i, "task"), r.names())
		}
	}
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) != len(want) {
		t.Fatalf("stdout has %d lines, want %d (one per host result):\n%.2000s", len(lines), len(want), r.stdout)
	}
	for i, line := range lines {
		// A success line ends with the result as one-line JSON; an unreachable one is exact.
		ok := line == want[i] || strings.HasSuffix(want[i], "=> ") && strings.HasPrefix(line, want[i]+"{") && strings.HasSuffix(line, "}")
		if !ok {
			t.Errorf("stdout line %d = %q, want oneline's %q...", i+1, line, want[i])
		}
	}

	i := r.one(t, "runner_on_unreachable", "ping the dead host")
	var res struct{ Unreachable bool }
	r.field(t, i, "res", &res)
	if host, addr := r.str(i, "host"), r.str(i, "remote_addr"); host != "dead" || addr != "127.0.0.1" || !res.Unreachable {
		t.Errorf("runner_on_unreachable: host %q remote_addr %q res.unreachable %v, want dead, 127.0.0.1, true", host, addr, res.Unreachable)
	}
	got := statsFor(t, r, r.one(t, "playbook_on_stats", ""), "dead")
	if got["dark"] != 1 || got["ok"] != 0 || got["failures"] != 0 {
		t.Errorf("stats for dead = %v, want dark 1, ok 0, failures 0", got)
	}
	// serial: 1 starts the play and its task once per batch: every start gets its own uuid, and
	// each host's result hangs under its own batch's starts.
	var plays []int
	for _, i := range r.find("playbook_on_play_start", "") {
		if r.str(i, "play") == "serial play" {
			plays = append(plays, i)
		}
	}
	if len(plays) != 2 || r.str(plays[0], "play_uuid") != r.str(plays[1], "play_uuid") {
		t.Fatalf("serial play: want 2 play starts with one play_uuid, got %d; events: %s", len(plays), r.names())
	}
	byUUID := map[string]int{}
	for i, ev := range r.events {
		byUUID[ev.UUID] = i
	}
	results := r.find("runner_on_ok", "one batch at a time")
	if len(results) != 2 {
		t.Fatalf("serial play: %d runner_on_ok events, want one for b1 and one for b2; events: %s", len(results), r.names())
	}
	for _, i := range results {
		taskStart := byUUID[r.events[i].ParentUUID]
		want := map[string]int{"b1": plays[0], "b2": plays[1]}[r.str(i, "host")]
		if got := byUUID[r.events[taskStart].ParentUUID]; got != want {
			t.Errorf("serial play: %s's result hangs under play start counter %d, want %d", r.str(i, "host"), r.events[got].Counter, r.events[want].Counter)
		}
	}
	if len(r.find("playbook_on_no_hosts_matched", "")) != 1 {
		t.Errorf("want one playbook_on_no_hosts_matched for the play whose pattern matches nothing; events: %s", r.names())
	}
}

// statsFor returns host's count in each of playbook_on_stats' dicts (0 when absent).
func statsFor(t *testing.T, r ansibleRun, i int, host string) map[string]int {
	t.Helper()
	got := map[string]int{}
	for _, name := range []string{"ok", "changed", "failures", "dark", "skipped", "rescued", "ignored", "processed"} {
		var counts map[string]int
		r.field(t, i, name, &counts)
		got[name] = counts[host]
	}
	return got
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func mapKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func mapValues(m map[string]string) []string {
	var vs []string
	for _, v := range m {
		vs = append(vs, v)
	}
	return vs
}

// TestPluginCorners drives the plugin from a Python process (testdata/driver.py) for what a
// playbook cannot reach: bad AF_EVENTS_FD values, an exception inside a callback, a reader that
// went away, a vaulted value, and a line over the limit.
func TestPluginCorners(t *testing.T) {
	t.Parallel()
	python := ansiblePython(t)
	work := t.TempDir()
	pluginDir, err := afevents.Install(filepath.Join(work, "plugins"))
	if err != nil {
		t.Fatalf("Install: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, filepath.Join("testdata", "driver.py"), filepath.Join(pluginDir, afevents.PluginFile), work)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + work, "LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1",
		"ANSIBLE_LOCAL_TEMP=" + filepath.Join(work, "tmp"), "ANSIBLE_CONFIG=" + filepath.Join(work, "none.cfg")}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("driver.py: %v\nstderr:\n%s", err, stderr.String())
	}
	type state struct {
		Disabled    bool     `json:"disabled"`
		EnvLeft     bool     `json:"env_left"`
		Inheritable bool     `json:"inheritable"`
		Stopped     bool     `json:"stopped"`
		Lines       []string `json:"lines"`
	}
	var report map[string]state
	if err := json.Unmarshal(out, &report); err != nil {
		t.Fatalf("driver report: %v\n%s", err, out)
	}

	for _, name := range []string{"unset", "stdout_fd", "garbage", "closed_fd"} {
		if s := report[name]; !s.Disabled || s.EnvLeft {
			t.Errorf("AF_EVENTS_FD case %s: disabled=%v env_left=%v, want the plugin disabled and %s removed from the environment", name, s.Disabled, s.EnvLeft, afevents.EnvFD)
		}
	}
	if !strings.Contains(stderr.String(), "is not a usable events channel") {
		t.Errorf("a bad AF_EVENTS_FD must be explained on stderr; got:\n%s", stderr.String())
	}
	if s := report["broken_pipe"]; s.Disabled || !s.Stopped {
		t.Errorf("after the reader closed the pipe: disabled=%v stopped=%v, want the plugin to stop writing without raising", s.Disabled, s.Stopped)
	}

	w := report["working"]
	if w.Disabled || w.EnvLeft || w.Inheritable {
		t.Fatalf("with a good fd: disabled=%v env_left=%v inheritable=%v, want false for all (the fd must be close-on-exec)", w.Disabled, w.EnvLeft, w.Inheritable)
	}
	joined := strings.Join(w.Lines, "")
	if strings.Contains(joined, "canary-driver") {
		t.Errorf("a no_log value or ansible_env reached the events:\n%s", joined)
	}
	var events []afevents.Event
	for n, line := range w.Lines {
		if !strings.HasSuffix(line, "\n") {
			t.Fatalf("line %d does not end with a newline: %.200q", n+1, line)
		}
		ev, err := afevents.ParseEvent([]byte(line))
		if err != nil {
			t.Fatalf("line %d: %v", n+1, err)
		}
		if ev.Counter != n+1 {
			t.Errorf("line %d has counter %d", n+1, ev.Counter)
		}
		events = append(events, ev)
	}
	var names []string
	for _, ev := range events {
		names = append(names, ev.Event)
	}
	want := []string{"playbook_on_start", "warning", "warning", "runner_on_ok", "runner_on_ok", "playbook_on_stats"}
	if !slices.Equal(names, want) {
		t.Fatalf("driver events %v, want %v (one warning for the failed callback, one for the repeated display warning)", names, want)
	}

	var failure struct{ Message, Source string }
	_ = json.Unmarshal(events[1].EventData, &failure)
	if failure.Source != "af_events" || !strings.Contains(failure.Message, "v2_runner_on_ok failed") {
		t.Errorf("callback failure reported as %+v, want source af_events and a message naming v2_runner_on_ok", failure)
	}

	var hidden struct{ Res map[string]any }
	_ = json.Unmarshal(events[3].EventData, &hidden)
	if !mapsEqual(hidden.Res, map[string]any{"censored": afevents.Censored}) {
		t.Errorf("result of a no_log task = %v, want only the censored notice (no invocation, no changed)", hidden.Res)
	}

	var plain struct {
		Res struct {
			AnsibleFacts map[string]any   `json:"ansible_facts"`
			Results      []map[string]any `json:"results"`
			Vaulted      map[string]string
		}
	}
	if err := json.Unmarshal(events[4].EventData, &plain); err != nil {
		t.Fatalf("plain result: %v", err)
	}
	if _, ok := plain.Res.AnsibleFacts["ansible_env"]; ok || plain.Res.AnsibleFacts["kept"] != 1.0 {
		t.Errorf("ansible_facts = %v, want ansible_env dropped and kept=1", plain.Res.AnsibleFacts)
	}
	if len(plain.Res.Results) != 2 || plain.Res.Results[0]["item"] != "public" || plain.Res.Results[1]["censored"] != afevents.Censored || len(plain.Res.Results[1]) != 1 {
		t.Errorf("loop results = %v, want the public item kept and the no_log item censored", plain.Res.Results)
	}
	if v := plain.Res.Vaulted["__ansible_vault"]; v != "$ANSIBLE_VAULT;1.1;AES256\n3132333435" {
		t.Errorf("vaulted value = %v, want its ciphertext under __ansible_vault (never decrypted)", plain.Res.Vaulted)
	}

	// The driver lowered the line limit to 100000 bytes for a stats event of 2000 hosts.
	stats := w.Lines[len(w.Lines)-1]
	if len(stats) > 100000 || !strings.Contains(stats, `"`+afevents.TruncatedKey+`":true`) {
		t.Errorf("oversized stats line is %d bytes (limit 100000), marker present: %v", len(stats), strings.Contains(stats, afevents.TruncatedKey))
	}
}

// ansiblePython returns the interpreter ansible-playbook runs under, from its #! line.
func ansiblePython(t *testing.T) string {
	t.Helper()
	bin := requireAnsible(t)
	f, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	first, _ := bufio.NewReader(f).ReadString('\n')
	fields := strings.Fields(strings.TrimPrefix(first, "#!"))
	if len(fields) == 0 {
		t.Skipf("cannot tell which python runs %s (first line %q)", bin, first)
	}
	if filepath.Base(fields[0]) == "env" && len(fields) > 1 {
		return fields[1]
	}
	return fields[0]
}

func TestInstall(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "plugins")
	for round := range 2 { // the second round rewrites an existing install
		got, err := afevents.Install(dir)
		if err != nil {
			t.Fatalf("round %d: Install: %v", round, err)
		}
		if got != dir {
			t.Errorf("round %d: Install returned %q, want %q", round, got, dir)
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 || entries[0].Name() != afevents.PluginFile {
			t.Errorf("round %d: plugin directory holds %v, want only %s", round, entries, afevents.PluginFile)
		}
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("plugin directory mode %v (err %v), want 0700", fi.Mode().Perm(), err)
	}
	fi, err := os.Stat(filepath.Join(dir, afevents.PluginFile))
	if err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("plugin file mode %v (err %v), want 0644", fi.Mode().Perm(), err)
	}
	installed, _ := os.ReadFile(filepath.Join(dir, afevents.PluginFile))
	source, _ := os.ReadFile(afevents.PluginFile)
	if !bytes.Equal(installed, source) || len(source) == 0 {
		t.Errorf("installed plugin (%d bytes) differs from %s (%d bytes)", len(installed), afevents.PluginFile, len(source))
	}

	rel := t.TempDir()
	t.Chdir(rel)
	got, err := afevents.Install("rel")
	if err != nil || got != filepath.Join(rel, "rel") {
		t.Errorf("Install(\"rel\") = %q, %v; want the absolute %s", got, err, filepath.Join(rel, "rel"))
	}
}

func TestInstallRefusals(t *testing.T) {
	file := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dir, want string
	}{
		{"empty", "", "directory is empty"},
		{"file in the way", file, file},
		{"under a file", filepath.Join(file, "plugins"), file},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := afevents.Install(tc.dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Install(%q) error %v, want one mentioning %q", tc.dir, err, tc.want)
			}
		})
	}
}

func TestEnv(t *testing.T) {
	got := afevents.Env("/srv/rte/plugins", 3)
	want := []string{
		"ANSIBLE_CALLBACK_PLUGINS=/srv/rte/plugins:~/.ansible/plugins/callback:/usr/share/ansible/plugins/callback",
		"ANSIBLE_CALLBACKS_ENABLED=af_events",
		"AF_EVENTS_FD=3",
	}
	if !slices.Equal(got, want) {
		t.Errorf("Env = %q, want %q", got, want)
	}
}

// TestConstantsMatchPlugin keeps the Go constants and the Python ones in step.
func TestConstantsMatchPlugin(t *testing.T) {
	src, err := os.ReadFile(afevents.PluginFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"ENV_FD = '" + afevents.EnvFD + "'",
		"CALLBACK_NAME = '" + afevents.CallbackName + "'",
		"MAX_RES_BYTES = " + strconv.Itoa(afevents.MaxResBytes) + "\n",
		"MAX_LINE_BYTES = " + strconv.Itoa(afevents.MaxLineBytes) + "\n",
		"PREVIEW_BYTES = " + strconv.Itoa(afevents.PreviewBytes) + "\n",
		`CENSORED = "` + afevents.Censored + `"`,
		"'" + afevents.TruncatedKey + "': True",
		"CALLBACK_TYPE = 'notification'",
		"CALLBACK_NEEDS_ENABLED = True",
	} {
		if !bytes.Contains(src, []byte(want)) {
			t.Errorf("%s does not contain %q", afevents.PluginFile, want)
		}
	}
}

const goodLine = `{"event":"runner_on_ok","uuid":"u1","parent_uuid":"t1","counter":7,"created":"2026-12-02T10:00:00.123456789Z","event_data":{"host":"h"}}` + "\n"

func TestParseEvent(t *testing.T) {
	ev, err := afevents.ParseEvent([]byte(goodLine))
	if err != nil {
		t.Fatalf("ParseEvent(good line): %v", err)
	}
	want := time.Date(2026, 12, 2, 10, 0, 0, 123456789, time.UTC)
	if ev.Event != "runner_on_ok" || ev.UUID != "u1" || ev.ParentUUID != "t1" || ev.Counter != 7 || !ev.Created.Equal(want) || string(ev.EventData) != `{"host":"h"}` {
		t.Errorf("ParseEvent(good line) = %+v", ev)
	}
}

func TestParseEventRefusals(t *testing.T) {
	for _, tc := range []struct {
		name, line, want string
	}{
		{"not json", `{"event":`, "decode event line"},
		{"array", `[]`, "decode event line"},
		{"no event", `{"uuid":"u","counter":1,"created":"2026-01-01T00:00:00Z","event_data":{}}`, "event is missing"},
		{"no uuid", `{"event":"e","counter":1,"created":"2026-01-01T00:00:00Z","event_data":{}}`, "uuid is missing"},
		{"zero counter", `{"event":"e","uuid":"u","counter":0,"created":"2026-01-01T00:00:00Z","event_data":{}}`, "counter is 0"},
		{"no created", `{"event":"e","uuid":"u","counter":1,"event_data":{}}`, "created is missing"},
		{"bad created", `{"event":"e","uuid":"u","counter":1,"created":"yesterday","event_data":{}}`, "decode event line"},
		{"no event_data", `{"event":"e","uuid":"u","counter":1,"created":"2026-01-01T00:00:00Z"}`, "event_data is not a JSON object"},
		{"event_data null", `{"event":"e","uuid":"u","counter":1,"created":"2026-01-01T00:00:00Z","event_data":null}`, "event_data is not a JSON object"},
		{"event_data list", `{"event":"e","uuid":"u","counter":1,"created":"2026-01-01T00:00:00Z","event_data":[1]}`, "event_data is not a JSON object"},
		{"too long", `"` + strings.Repeat("x", afevents.MaxLineBytes) + `"`, "over the"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := afevents.ParseEvent([]byte(tc.line))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseEvent(%.60q) error %v, want one containing %q", tc.line, err, tc.want)
			}
		})
	}
}

func FuzzParseEvent(f *testing.F) {
	f.Add([]byte(goodLine))
	f.Add([]byte(`{"event":"e","uuid":"u","counter":1,"created":"2026-01-01T00:00:00Z","event_data":{}}`))
	f.Add([]byte(`{"event":"","counter":-1,"event_data":"x"}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		ev, err := afevents.ParseEvent(line)
		if err != nil {
			return
		}
		if ev.Event == "" || ev.UUID == "" || ev.Counter < 1 || ev.Created.IsZero() || len(ev.EventData) == 0 || ev.EventData[0] != '{' {
			t.Fatalf("ParseEvent accepted an invalid event: %+v", ev)
		}
	})
}

// TestEventLinesSliceTheOutput runs the richest test playbook with the default stdout callback
// and stdout and stderr on one pipe, as the RTE runs jobs: each event's start_line and
// end_line cut the job's output into exactly that event's stdout, the ranges follow each other
// without gap or overlap, and runner_ident and pid say which job and process wrote them.
func TestEventLinesSliceTheOutput(t *testing.T) {
	t.Parallel()
	// An existing HOME: ansible warns about a missing one while it starts, before it loads
	// callbacks, and such early text is in no event (docs/protocol.md#events).
	r := runPlaybookOutput(t, true, "main.yml", "local ansible_connection=local ansible_python_interpreter=/usr/bin/python3\n",
		"ANSIBLE_STDOUT_CALLBACK=default", "AF_JOB_ID=job-lines-1", "HOME="+t.TempDir())
	lines := strings.SplitAfter(r.stdout, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	next, pid := 0, r.events[0].PID
	var shown strings.Builder
	for _, ev := range r.events {
		if ev.StartLine != next {
			t.Fatalf("%s (counter %d) starts at line %d, want %d, where the previous event ended", ev.Event, ev.Counter, ev.StartLine, next)
		}
		if ev.EndLine > len(lines) {
			t.Fatalf("%s (counter %d) ends at line %d; the output has %d lines:\n%s", ev.Event, ev.Counter, ev.EndLine, len(lines), r.stdout)
		}
		if got := strings.Join(lines[ev.StartLine:ev.EndLine], ""); got != ev.Stdout {
			t.Fatalf("%s (counter %d): lines %d-%d of the output are\n%q\nbut its stdout is\n%q", ev.Event, ev.Counter, ev.StartLine, ev.EndLine, got, ev.Stdout)
		}
		if ev.RunnerIdent != "job-lines-1" || ev.PID != pid || pid <= 0 {
			t.Fatalf("%s (counter %d): runner_ident %q pid %d, want job-lines-1 and one pid for the run", ev.Event, ev.Counter, ev.RunnerIdent, ev.PID)
		}
		next = ev.EndLine
		shown.WriteString(ev.Stdout)
	}
	if next != len(lines) || shown.String() != r.stdout {
		t.Fatalf("the events' stdout joined is not the job's output: the events cover %d of %d lines", next, len(lines))
	}
	// The text is where a reader expects it: a task's banner on its task start, a host's
	// result on its runner event, the recap on the stats.
	for _, c := range []struct{ event, task, says string }{
		{"playbook_on_task_start", "", "TASK ["},
		{"runner_on_ok", "", "ok: [local]"},
		{"playbook_on_stats", "", "PLAY RECAP"},
	} {
		i := r.find(c.event, c.task)
		if len(i) == 0 || !strings.Contains(r.events[i[0]].Stdout, c.says) {
			t.Errorf("the first %s event's stdout does not say %q", c.event, c.says)
		}
	}
	if strings.Contains(r.stdout, canary) {
		t.Errorf("the no_log secret is in the output")
	}
}
