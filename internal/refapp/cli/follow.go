package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/rte-project/rte/internal/refapp/api"
	"github.com/rte-project/rte/internal/refapp/display"
	"github.com/rte-project/rte/internal/refapp/sse"
	"github.com/rte-project/rte/internal/refapp/summary"
	"github.com/rte-project/rte/protocol"
)

// Timing of following a job; variables so a test need not wait for them.
var (
	// followOutage is how long follow keeps reconnecting to an app it lost before giving up:
	// long enough for the app to restart, short enough that a script does not hang forever.
	followOutage = 2 * time.Minute
	// followBackoffMax caps the wait between reconnects.
	followBackoffMax = 10 * time.Second
	// cancelGrace is how long an interrupted run waits for the canceled job's end: the RTE
	// sends TERM, then KILL after 10 s, then the end record.
	cancelGrace = time.Minute
)

// outcome is how a followed job ended.
type outcome struct {
	Job      api.JobView
	Status   string // the end record's status, or the job's when it ended without one
	ExitCode int
	Message  string
	Events   []json.RawMessage
}

// Exit statuses of rte-app (docs/reference-app.md has the table). Bad usage is 2 in rte too,
// so a supervisor or script reads both binaries the same way.
const (
	ExitOK       = 0 // the job succeeded, or the command did what was asked
	ExitTrouble  = 1 // rte-app could not do what was asked: app unreachable, refused, interrupted
	ExitUsage    = 2 // bad command line or settings; nothing was done
	ExitNotEnded = 3 // the job did not end normally: canceled, timeout, abandoned, error
	ExitFailed   = 4 // the playbook ran and failed (a task failed or a host was unreachable)
)

// exitFor maps a job's end status to rte-app's exit status.
func exitFor(status string) int {
	switch status {
	case protocol.StatusSuccess:
		return ExitOK
	case protocol.StatusFailed:
		return ExitFailed
	default:
		return ExitNotEnded
	}
}

// follow prints the job's output as it arrives, from the first record, and returns once the
// job has ended. A lost stream is reopened from the last record seen, so nothing is printed
// twice or skipped; after followOutage without the app it gives up.
func follow(ctx context.Context, c *Client, id string, out, notes io.Writer) (outcome, error) {
	var (
		res     outcome
		after   int64
		ended   bool
		backoff = time.Second
		lastOK  = time.Now()
	)
	for {
		resp, err := c.OpenStream(ctx, id, after)
		if err == nil {
			lastOK, backoff = time.Now(), time.Second
			var done bool
			done, err = readStream(resp, &res, &after, &ended, out, notes)
			resp.Body.Close()
			if done {
				return finish(res, ended), nil
			}
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
		}
		var ae *apiError
		switch {
		case ctx.Err() != nil:
			return res, ctx.Err()
		case errors.As(err, &ae) && ae.Status < http.StatusInternalServerError:
			return res, err
		case time.Since(lastOK) > followOutage:
			return res, fmt.Errorf("gave up following job %s after %s without the app: %w", id, followOutage, err)
		}
		fmt.Fprintf(notes, "rte-app: lost the stream of job %s (%v); reconnecting from record %d\n", id, err, after)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return res, ctx.Err()
		}
		backoff = min(2*backoff, followBackoffMax)
	}
}

// readStream handles events until the stream's closing job event (done) or an error.
func readStream(resp *http.Response, res *outcome, after *int64, ended *bool, out, notes io.Writer) (done bool, err error) {
	r := sse.NewReader(resp.Body)
	for {
		ev, err := r.Next()
		if err != nil {
			return false, err
		}
		switch ev.Name {
		case api.EventRecord:
			var rec protocol.Record
			if err := json.Unmarshal(ev.Data, &rec); err != nil {
				return false, fmt.Errorf("a record of the stream does not decode: %w", err)
			}
			if rec.Seq <= *after {
				continue
			}
			*after = rec.Seq
			if printRecord(rec, res, out, notes) {
				*ended = true
			}
		case api.EventJob:
			if err := json.Unmarshal(ev.Data, &res.Job); err != nil {
				return false, fmt.Errorf("the stream's last event does not decode: %w", err)
			}
			return true, nil
		}
	}
}

// printRecord shows one record and keeps what the outcome needs; it reports an end record.
func printRecord(rec protocol.Record, res *outcome, out, notes io.Writer) bool {
	switch rec.Kind {
	case protocol.KindOutput:
		var d protocol.OutputData
		if json.Unmarshal(rec.Data, &d) == nil {
			io.WriteString(out, d.Text)
		}
	case protocol.KindEvents:
		var d protocol.EventsData
		if json.Unmarshal(rec.Data, &d) == nil {
			res.Events = append(res.Events, d.Events...)
		}
	case protocol.KindStart:
		var d protocol.StartData
		if json.Unmarshal(rec.Data, &d) == nil {
			fmt.Fprintf(notes, "rte: %s started on %s (pid %d)\n", display.OneLine(d.Playbook, 200), display.OneLine(d.Instance, 100), d.PID)
		}
	case protocol.KindLog:
		var d protocol.LogData
		if json.Unmarshal(rec.Data, &d) == nil {
			fmt.Fprintf(notes, "rte %s: %s\n", display.OneLine(d.Level, 10), display.OneLine(d.Message, 1000))
		}
	case protocol.KindEnd:
		var d protocol.EndData
		if json.Unmarshal(rec.Data, &d) == nil {
			res.Status, res.ExitCode, res.Message = d.Status, d.ExitCode, d.Message
		}
		return true
	}
	return false
}

// finish fills the outcome from the job when it ended without an end record.
func finish(res outcome, ended bool) outcome {
	if !ended {
		res.Status, res.ExitCode, res.Message = res.Job.Status, res.Job.ExitCode, res.Job.Message
	}
	if res.Status == "" {
		res.Status = protocol.StatusError
	}
	return res
}

// FollowAndReport follows a job, prints the Hosts and tasks summary and the end, and returns
// the exit status. The first interrupt (ctx done) cancels the job and keeps following until
// its end arrives, up to cancelGrace; a second interrupt exits at once (main restores the
// default signal handling after the first).
func FollowAndReport(ctx context.Context, c *Client, id string, stdout, stderr io.Writer) int {
	followCtx, stopFollow := context.WithCancel(context.WithoutCancel(ctx))
	defer stopFollow()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-followCtx.Done():
			return
		case <-ctx.Done():
		}
		fmt.Fprintf(stderr, "\nrte-app: interrupted: canceling job %s and waiting for its end (interrupt again to exit at once)\n", id)
		if _, err := c.cancel(followCtx, id); err != nil {
			fmt.Fprintf(stderr, "rte-app: cancel job %s: %v\n", id, err)
		}
		t := time.NewTimer(cancelGrace)
		defer t.Stop()
		select {
		case <-t.C:
			fmt.Fprintf(stderr, "rte-app: job %s did not end within %s of the cancel; not waiting longer\n", id, cancelGrace)
			stopFollow()
		case <-followCtx.Done():
		}
	}()
	res, err := follow(followCtx, c, id, stdout, stderr)
	stopFollow()
	wg.Wait()
	if err != nil {
		fmt.Fprintf(stderr, "rte-app: %v\n", err)
		if len(res.Events) > 0 {
			fmt.Fprintln(stdout)
			_ = summary.Summarize(res.Events).WriteText(stdout)
		}
		var ae *apiError
		if !errors.As(err, &ae) || ae.Status >= http.StatusInternalServerError {
			fmt.Fprintf(stderr, "rte-app: job %s may still be running: rte-app follow %s, or rte-app cancel %s\n", id, id, id)
		}
		return ExitTrouble
	}
	fmt.Fprintln(stdout)
	if err := summary.Summarize(res.Events).WriteText(stdout); err != nil {
		return ExitTrouble
	}
	fmt.Fprintf(stdout, "\njob %s on %s: %s", id, res.Job.Runner, res.Status)
	if res.Status != protocol.StatusSuccess {
		fmt.Fprintf(stdout, " (ansible exit code %d)", res.ExitCode)
	}
	if res.Message != "" {
		fmt.Fprintf(stdout, ": %s", display.OneLine(res.Message, 1000))
	}
	fmt.Fprintln(stdout)
	return exitFor(res.Status)
}
