package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/internal/refapp/api"
	"github.com/rte-project/rte/internal/refapp/display"
	"github.com/rte-project/rte/internal/refapp/summary"
	"github.com/rte-project/rte/protocol"
)

// runnersData is the Data of runners.html.
type runnersData struct {
	Runners []webRunner
	Waiting []webRunner
}

func (wb *web) runnersPage(w http.ResponseWriter, r *http.Request, v visit) {
	runners, err := wb.api.App().ListRunners(r.Context())
	if err != nil {
		wb.internal(w, r, &v, "list runners", err)
		return
	}
	now := wb.now()
	var data runnersData
	for _, rn := range runners {
		st, live := wb.api.App().Status(rn.Name)
		row := newWebRunner(rn, st, live, now)
		data.Runners = append(data.Runners, row)
		if row.Waiting {
			data.Waiting = append(data.Waiting, row)
		}
	}
	wb.render(w, r, &v, http.StatusOK, "runners.html", page{Title: "Runners", Section: "runners", Data: data})
}

// runnerData is the Data of runner.html.
type runnerData struct {
	Runner webRunner
	Jobs   []webJob // the runner's latest jobs
}

// recentJobs is how many of a runner's jobs its page lists.
const recentJobs = 10

func (wb *web) runnerPage(w http.ResponseWriter, r *http.Request, v visit) {
	wb.showRunner(w, r, v, http.StatusOK, "")
}

// showRunner draws the runner's page, with the review when it waits for approval; problem,
// when set, says why the last action was refused.
func (wb *web) showRunner(w http.ResponseWriter, r *http.Request, v visit, status int, problem string) {
	name := r.PathValue("name")
	rn, err := wb.api.LookupRunner(r.Context(), name)
	if err != nil {
		wb.runnerFailure(w, r, v, name, err)
		return
	}
	jobs, err := wb.api.App().ListJobs(r.Context(), app.JobFilter{Runner: name, Limit: recentJobs})
	if err != nil {
		wb.internal(w, r, &v, "list jobs", err)
		return
	}
	now := wb.now()
	st, live := wb.api.App().Status(name)
	data := runnerData{Runner: newWebRunner(rn, st, live, now)}
	for _, j := range jobs {
		data.Jobs = append(data.Jobs, newWebJob(j, now))
	}
	wb.render(w, r, &v, status, "runner.html", page{Title: name, Section: "runners", Error: problem, Data: data})
}

// runnerFailure shows a runner lookup's failure: a 404 page for an unknown name.
func (wb *web) runnerFailure(w http.ResponseWriter, r *http.Request, v visit, name string, err error) {
	var ref *api.Refusal
	if errors.As(err, &ref) && ref.Status == http.StatusNotFound {
		wb.fail(w, r, &v, http.StatusNotFound, "Runner not found",
			fmt.Sprintf("There is no runner named %s. It may have been rejected, or its request was dropped after waiting too long; an RTE registers again when it restarts.", config.Quote(name)))
		return
	}
	wb.failure(w, r, &v, "read runner", err)
}

// approve approves what the review showed, and only that. The form carries the token
// fingerprint, the certificate fingerprint ("" for none) and the URL the admin compared; if
// the runner registered again since, with anything different, nothing is approved and the
// page shows the new values to compare. app.ApproveShown compares and approves under one lock.
func (wb *web) approve(w http.ResponseWriter, r *http.Request, v visit) {
	name := r.PathValue("name")
	rn, err := wb.api.LookupRunner(r.Context(), name)
	if err != nil {
		wb.runnerFailure(w, r, v, name, err)
		return
	}
	if rn.State == app.StateApproved && rn.PendingCertificate == nil {
		wb.sessions.setFlash(v.id, fmt.Sprintf("%s is already approved: nothing was changed.", name))
		http.Redirect(w, r, "/runners/"+url.PathEscape(name), http.StatusSeeOther)
		return
	}
	// The page shows the full SHA-256 and posts it back: the approval is bound to that, not
	// to the 32-bit short fingerprint a ground certificate could match.
	shown := app.Shown{
		TokenFingerprint:       r.PostFormValue("token_fingerprint"),
		URL:                    r.PostFormValue("url"),
		CertificateFingerprint: strings.TrimSpace(r.PostFormValue("certificate_fingerprint")),
		CertificateSHA256:      strings.TrimSpace(r.PostFormValue("certificate_sha256")),
		Complete:               true,
	}
	approved, err := wb.api.App().ApproveShown(r.Context(), name, shown)
	if err != nil {
		var ch *app.ChangedError
		if errors.As(err, &ch) {
			wb.showRunner(w, r, v, http.StatusConflict, changedSince(ch)+" Nothing was approved: compare the values below with the RTE's log again.")
			return
		}
		var ref *api.Refusal
		if err = api.ApproveRefusal(name, err); errors.As(err, &ref) && ref.Status != http.StatusNotFound {
			wb.showRunner(w, r, v, ref.Status, sentence(ref.Message))
			return
		}
		wb.runnerFailure(w, r, v, name, err)
		return
	}
	msg := fmt.Sprintf("Approved %s. The app now dials %s", name, approved.URL)
	if approved.Certificate != nil {
		msg += " and trusts only certificate " + protocol.CertificateFingerprint(approved.Certificate)
	}
	wb.sessions.setFlash(v.id, msg+".")
	http.Redirect(w, r, "/runners", http.StatusSeeOther)
}

// changedSince says what differs between the runner now and what the review showed.
func changedSince(ch *app.ChangedError) string {
	now := ch.Now
	switch {
	case ch.Field == "token_fingerprint":
		return fmt.Sprintf("The RTE registered again with another token since the page was drawn: its token fingerprint is now %s.", now.TokenFingerprint)
	case ch.Field == "url":
		return fmt.Sprintf("The RTE registered again with another address since the page was drawn: it is now %s.", now.URL)
	case now.PendingCertificate == nil:
		return "The certificate that was shown is no longer waiting for approval."
	}
	return fmt.Sprintf("The RTE registered again with another certificate since the page was drawn: the certificate waiting is now %s (sha256 %s).",
		protocol.CertificateFingerprint(now.PendingCertificate), protocol.CertificateSHA256(now.PendingCertificate))
}

func (wb *web) reject(w http.ResponseWriter, r *http.Request, v visit) {
	name := r.PathValue("name")
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if err := wb.api.App().Reject(r.Context(), name, reason); err != nil {
		if errors.Is(err, app.ErrNotFound) {
			wb.runnerFailure(w, r, v, name, api.Refuse(http.StatusNotFound, "no runner"))
			return
		}
		wb.internal(w, r, &v, "reject runner", err)
		return
	}
	wb.sessions.setFlash(v.id, fmt.Sprintf("Rejected %s and removed it with its token. If the RTE registers again, it waits for approval anew.", name))
	http.Redirect(w, r, "/runners", http.StatusSeeOther)
}

// clearWaiting rejects every registration request still waiting (app.ClearWaiting).
func (wb *web) clearWaiting(w http.ResponseWriter, r *http.Request, v visit) {
	names, err := wb.api.App().ClearWaiting(r.Context(), "an admin rejected every waiting request on the runners page")
	if err != nil {
		wb.internal(w, r, &v, "clear waiting requests", err)
		return
	}
	msg := "No request was waiting."
	if len(names) > 0 {
		msg = fmt.Sprintf("Rejected %d waiting requests: %s. An RTE that registers again waits for approval anew.", len(names), strings.Join(names, ", "))
	}
	wb.sessions.setFlash(v.id, msg)
	http.Redirect(w, r, "/runners", http.StatusSeeOther)
}

// jobsData is the Data of jobs.html.
type jobsData struct {
	Jobs    []webJob
	Runners []string // approved runners, for the form
	Form    jobForm
	// ErrField names the form field the refusal is about, so the page marks it.
	ErrField string
}

// jobForm is the start-a-job form as typed, kept to show again with a refusal.
type jobForm struct {
	Runner, Playbook, Inventories, Extravars, Limit string
	Check                                           bool
}

// listedJobs is how many jobs the jobs page lists, newest first.
const listedJobs = 100

func (wb *web) jobsPage(w http.ResponseWriter, r *http.Request, v visit) {
	wb.showJobs(w, r, v, http.StatusOK, jobForm{Runner: r.URL.Query().Get("runner")}, "")
}

func (wb *web) showJobs(w http.ResponseWriter, r *http.Request, v visit, status int, form jobForm, problem string) {
	jobs, err := wb.api.App().ListJobs(r.Context(), app.JobFilter{Limit: listedJobs})
	if err != nil {
		wb.internal(w, r, &v, "list jobs", err)
		return
	}
	runners, err := wb.api.App().ListRunners(r.Context())
	if err != nil {
		wb.internal(w, r, &v, "list runners", err)
		return
	}
	now := wb.now()
	data := jobsData{Form: form, ErrField: errorField(problem)}
	for _, j := range jobs {
		data.Jobs = append(data.Jobs, newWebJob(j, now))
	}
	for _, rn := range runners {
		if rn.State == app.StateApproved {
			data.Runners = append(data.Runners, rn.Name)
		}
	}
	wb.render(w, r, &v, status, "jobs.html", page{Title: "Jobs", Section: "jobs", Error: problem, Data: data})
}

// errorField is the form field a refusal names ("playbook: is required" -> "playbook").
func errorField(problem string) string {
	field, _, ok := strings.Cut(problem, ":")
	if !ok {
		return ""
	}
	field, _, _ = strings.Cut(strings.ToLower(field), "[")
	switch field {
	case "runner", "playbook", "inventories", "extravars", "limit":
		return field
	}
	return ""
}

func (wb *web) startJob(w http.ResponseWriter, r *http.Request, v visit) {
	form := jobForm{
		Runner:      r.PostFormValue("runner"),
		Playbook:    r.PostFormValue("playbook"),
		Inventories: r.PostFormValue("inventories"),
		Extravars:   r.PostFormValue("extravars"),
		Limit:       r.PostFormValue("limit"),
		Check:       r.PostFormValue("check") != "",
	}
	body, err := form.request()
	if err == nil {
		var job *app.Job
		job, err = wb.api.SubmitJob(r.Context(), body)
		if err == nil {
			wb.log.Info("job started from the admin page", zap.String("job", job.ID), zap.String("runner", job.Runner))
			http.Redirect(w, r, "/jobs/"+url.PathEscape(job.ID), http.StatusSeeOther)
			return
		}
	}
	var ref *api.Refusal
	if !errors.As(err, &ref) {
		wb.internal(w, r, &v, "start job", err)
		return
	}
	wb.showJobs(w, r, v, ref.Status, form, sentence(ref.Message))
}

// request turns the form into the admin API's job request. Only what a form adds is checked
// here (extra vars must parse); the rest is the API's own checks, in submitJob.
func (f jobForm) request() (api.JobRequest, error) {
	req := api.JobRequest{
		Runner: strings.TrimSpace(f.Runner),
		JobOptions: api.JobOptions{
			Playbook: strings.TrimSpace(f.Playbook),
			Limit:    strings.TrimSpace(f.Limit),
			Check:    f.Check,
		},
	}
	for _, line := range strings.Split(f.Inventories, "\n") {
		if inv := strings.TrimSpace(line); inv != "" {
			req.Inventories = append(req.Inventories, inv)
		}
	}
	if ev := strings.TrimSpace(f.Extravars); ev != "" {
		var x any
		if err := json.Unmarshal([]byte(ev), &x); err != nil {
			var syntax *json.SyntaxError
			where := ""
			if errors.As(err, &syntax) {
				where = fmt.Sprintf(" at character %d", syntax.Offset)
			}
			return api.JobRequest{}, api.Refuse(http.StatusBadRequest, "extravars: not valid JSON%s (%s): give a JSON object, such as {\"version\": \"1.2\"}, or leave it empty",
				where, display.OneLine(strings.TrimPrefix(err.Error(), "json: "), 120))
		}
		req.Extravars = json.RawMessage(ev)
	}
	return req, nil
}

// jobData is the Data of job.html.
type jobData struct {
	Job     webJob
	Output  []outputPiece
	Cut     bool // the output's beginning is left out (maxPageOutput)
	Summary summaryView
	// After is the last record drawn: the live stream starts after it, so nothing is shown
	// twice or skipped. Live is set while the job has not ended.
	After int64
	Live  bool
}

func (wb *web) jobPage(w http.ResponseWriter, r *http.Request, v visit) {
	j, ok := wb.findJob(w, r, v)
	if !ok {
		return
	}
	recs, err := wb.readRecords(r.Context(), j.ID, true)
	if err != nil {
		wb.internal(w, r, &v, "read records", err)
		return
	}
	data := jobData{
		Job:     newWebJob(j, wb.now()),
		Output:  recs.output.pieces,
		Cut:     recs.output.cut,
		Summary: newSummaryView(summary.Summarize(recs.events), wb.runningUntil(j)),
		After:   recs.last,
		Live:    j.State != app.JobEnded,
	}
	wb.render(w, r, &v, http.StatusOK, "job.html", page{Title: "Job " + j.ID, Section: "jobs", Data: data})
}

// summaryFragment is the "Hosts and tasks" view alone, for the job page to fetch again as
// events arrive: the summary is built here, once, not again in the browser.
func (wb *web) summaryFragment(w http.ResponseWriter, r *http.Request, v visit) {
	j, ok := wb.findJob(w, r, v)
	if !ok {
		return
	}
	recs, err := wb.readRecords(r.Context(), j.ID, false)
	if err != nil {
		wb.internal(w, r, &v, "read records", err)
		return
	}
	wb.draw(w, http.StatusOK, "job.html", "summary", newSummaryView(summary.Summarize(recs.events), wb.runningUntil(j)))
}

// runningUntil is now for a job that has not ended, and zero for one that has: the summary
// shows a task still running only while the job runs.
func (wb *web) runningUntil(j *app.Job) time.Time {
	if j.State == app.JobEnded {
		return time.Time{}
	}
	return wb.now()
}

// stream is the admin API's event stream of the job's records, behind the page's session
// instead of the bearer token, which an EventSource cannot send.
func (wb *web) stream(w http.ResponseWriter, r *http.Request, _ visit) {
	wb.api.Stream(w, r)
}

func (wb *web) cancel(w http.ResponseWriter, r *http.Request, v visit) {
	id := r.PathValue("id")
	err := wb.api.App().Cancel(r.Context(), id)
	switch {
	case errors.Is(err, app.ErrNotFound):
		wb.jobNotFound(w, r, v, id)
		return
	case errors.Is(err, app.ErrJobEnded):
		wb.sessions.setFlash(v.id, "The job had already ended: there was nothing to cancel.")
	case err != nil:
		wb.internal(w, r, &v, "cancel job", err)
		return
	default:
		wb.log.Info("job cancel requested from the admin page", zap.String("job", id))
		wb.sessions.setFlash(v.id, "Cancel sent. The job ends canceled once the RTE has stopped the playbook.")
	}
	http.Redirect(w, r, "/jobs/"+url.PathEscape(id), http.StatusSeeOther)
}

// findJob returns the job the path names, or draws a 404 (or 500) page and returns false.
func (wb *web) findJob(w http.ResponseWriter, r *http.Request, v visit) (*app.Job, bool) {
	id := r.PathValue("id")
	j, err := wb.api.App().GetJob(r.Context(), id)
	switch {
	case errors.Is(err, app.ErrNotFound):
		wb.jobNotFound(w, r, v, id)
		return nil, false
	case err != nil:
		wb.internal(w, r, &v, "get job", err)
		return nil, false
	}
	return j, true
}

func (wb *web) jobNotFound(w http.ResponseWriter, r *http.Request, v visit, id string) {
	wb.fail(w, r, &v, http.StatusNotFound, "Job not found", fmt.Sprintf("There is no job %s. The jobs page lists them.", config.Quote(id)))
}

// jobRecords is what the page shows of a job's stored records.
type jobRecords struct {
	output outputTail
	events []json.RawMessage
	last   int64 // the last seq read
}

// readRecords reads every stored record of the job: the events for the summary and, when
// withOutput, the tail of the output.
func (wb *web) readRecords(ctx context.Context, id string, withOutput bool) (*jobRecords, error) {
	out := &jobRecords{output: outputTail{max: maxPageOutput}}
	for {
		recs, err := wb.api.App().Records(ctx, id, out.last, recordsPage)
		if err != nil {
			return nil, err
		}
		for _, rec := range recs {
			out.last = rec.Seq
			if rec.Kind == protocol.KindEvents {
				var d protocol.EventsData
				if json.Unmarshal(rec.Data, &d) == nil {
					out.events = append(out.events, d.Events...)
				}
				continue
			}
			if withOutput {
				if p, ok := pieceOf(rec); ok {
					out.output.add(p)
				}
			}
		}
		if len(recs) < recordsPage {
			return out, nil
		}
	}
}
