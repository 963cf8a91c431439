package api

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/internal/refapp/display"
	"github.com/rte-project/rte/protocol"
)

// Limits of the admin API.
const (
	// MaxJobBody bounds POST /api/v2/jobs. Well under the protocol's 16 MiB message, so a job
	// the API takes always fits in one job.start; large data belongs in the repository.
	MaxJobBody = 4 << 20
	// MaxSmallBody bounds the other bodies (approve, reject): a few short fields.
	MaxSmallBody = 64 << 10
	// defaultListLimit and maxListLimit bound GET /api/v2/jobs; defaultRecordsLimit and
	// maxRecordsLimit bound one page of records. A page of records is at most a few MiB
	// with the RTE's 64 KiB batches.
	defaultListLimit, maxListLimit       = 100, 1000
	defaultRecordsLimit, maxRecordsLimit = 500, 5000
	// streamPage is how many records a stream reads from the store at a time.
	streamPage = 200
	// streamWriteTimeout bounds one write to a stream's client; a client that reads nothing
	// for this long is dropped instead of holding a goroutine.
	streamWriteTimeout = time.Minute
)

// StreamKeepalive is how often a quiet stream sends an SSE comment, so a proxy between the
// CLI and the app does not close an idle stream during a long task. A stream also reads the
// store again at each, which catches records stored by another process (app nodes sharing
// one database) that Watch does not see. A variable so tests need not wait 15 s.
var StreamKeepalive = 15 * time.Second

// API serves the admin JSON API on top of an App. Every route needs the admin token. The
// admin page (package web) calls the same methods, so the page and the API refuse alike.
type API struct {
	app   *app.App
	log   *zap.Logger
	token [sha256.Size]byte // sha256 of APP_ADMIN_TOKEN, for a constant-time compare of equal lengths
	// closing ends every open stream when the server shuts down: http.Server.Shutdown does
	// not cancel request contexts, and a stream would otherwise hold shutdown for its timeout.
	closing <-chan struct{}
}

// New returns the admin API of a, guarded by adminToken. closing ends the open streams when it
// is closed: http.Server.Shutdown does not cancel request contexts.
func New(a *app.App, adminToken string, logger *zap.Logger, closing <-chan struct{}) *API {
	return &API{app: a, log: logger, token: sha256.Sum256([]byte(adminToken)), closing: closing}
}

// App is the app the API works on, for the admin page's reads.
func (h *API) App() *app.App { return h.app }

// Logger is the API's logger; the admin page logs under it.
func (h *API) Logger() *zap.Logger { return h.log }

// Handler returns the admin API under /api/v2/, behind APP_ADMIN_TOKEN. It does not serve the
// protocol's registration endpoint (app.Handler) or the page: package server mounts those.
func (h *API) Handler() http.Handler {
	admin := http.NewServeMux()
	admin.HandleFunc("GET /api/v2/runners", h.listRunners)
	admin.HandleFunc("POST /api/v2/runners/{name}/approve", h.approve)
	admin.HandleFunc("POST /api/v2/runners/{name}/reject", h.reject)
	admin.HandleFunc("POST /api/v2/runners/clear-waiting", h.clearWaiting)
	admin.HandleFunc("POST /api/v2/runners/{name}/check_node_connections", h.checkNodeConnections)
	admin.HandleFunc("POST /api/v2/jobs", h.submit)
	admin.HandleFunc("GET /api/v2/jobs", h.listJobs)
	admin.HandleFunc("GET /api/v2/jobs/{id}", h.getJob)
	admin.HandleFunc("GET /api/v2/jobs/{id}/records", h.records)
	admin.HandleFunc("GET /api/v2/jobs/{id}/stream", h.Stream)
	admin.HandleFunc("POST /api/v2/jobs/{id}/cancel", h.cancel)
	admin.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no endpoint %s %s: docs/reference-app.md lists the API", r.Method, display.OneLine(r.URL.Path, 200))
	})
	return h.authenticate(admin)
}

// TokenMatches reports whether given is APP_ADMIN_TOKEN. Both sides are hashed first, so the
// compare takes the same time whatever the length of the token tried.
func (h *API) TokenMatches(given string) bool {
	sum := sha256.Sum256([]byte(given))
	return given != "" && subtle.ConstantTimeCompare(sum[:], h.token[:]) == 1
}

// authenticate lets a request through only with Authorization: Bearer <APP_ADMIN_TOKEN>.
func (h *API) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		given, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || given == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="rte-app"`)
			writeError(w, http.StatusUnauthorized, "missing Authorization: Bearer <APP_ADMIN_TOKEN>: the admin API needs the app's admin token")
			return
		}
		if !h.TokenMatches(given) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="rte-app", error="invalid_token"`)
			writeError(w, http.StatusUnauthorized, "wrong admin token: use the APP_ADMIN_TOKEN the app was started with")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// LogRequests logs each request once it is answered: method, path, status and time taken.
// Neither headers nor bodies are logged: they carry the admin token and job secrets.
func (h *API) LogRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		fields := []zap.Field{
			zap.String("method", r.Method),
			zap.String("path", display.OneLine(r.URL.Path, 200)),
			zap.Int("status", rec.status),
			zap.Duration("took", time.Since(start)),
			zap.String("remote_addr", r.RemoteAddr),
		}
		switch {
		case rec.status >= 500:
			h.log.Error("request failed", fields...)
		case rec.status == http.StatusUnauthorized:
			h.log.Warn("request refused: no or wrong admin token", fields...)
		default:
			h.log.Debug("request", fields...)
		}
	})
}

// statusRecorder keeps the status written. Unwrap lets http.ResponseController reach the
// connection beneath for Flush and write deadlines, which streams need.
type statusRecorder struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (s *statusRecorder) WriteHeader(code int) {
	if !s.wroteHeader {
		s.status, s.wroteHeader = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	s.wroteHeader = true
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// Hijack lets an outbound runner's WebSocket upgrade through: gorilla/websocket asks the
// writer itself for http.Hijacker and does not look behind Unwrap.
func (s *statusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	s.status, s.wroteHeader = http.StatusSwitchingProtocols, true
	return http.NewResponseController(s.ResponseWriter).Hijack()
}

func (h *API) listRunners(w http.ResponseWriter, r *http.Request) {
	runners, err := h.app.ListRunners(r.Context())
	if err != nil {
		h.internal(w, "list runners", err)
		return
	}
	out := RunnersResponse{Runners: make([]RunnerView, 0, len(runners))}
	for _, rn := range runners {
		st, ok := h.app.Status(rn.Name)
		out.Runners = append(out.Runners, NewRunnerView(rn, st, ok))
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *API) approve(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var body ApproveRequest
	if !decodeOptionalBody(w, r, &body) {
		return
	}
	runner, err := h.ApproveRunner(r.Context(), name, body.CertificateFingerprint, body.CertificateSHA256)
	if err != nil {
		h.writeFailure(w, "approve runner", err)
		return
	}
	st, live := h.app.Status(name)
	writeJSON(w, http.StatusOK, NewRunnerView(runner, st, live))
}

// refusal is a request the app turns down: the status to answer and a message that names
// what was wrong and what to do. The admin API sends it as JSON, the admin page on the page.
type Refusal struct {
	Status  int
	Message string
}

func (e *Refusal) Error() string { return e.Message }

// Refuse returns a refusal answered with status and the formatted message.
func Refuse(status int, format string, args ...any) *Refusal {
	return &Refusal{Status: status, Message: fmt.Sprintf(format, args...)}
}

// writeFailure answers a refusal with its status and message, and anything else as a 500.
func (h *API) writeFailure(w http.ResponseWriter, what string, err error) {
	var ref *Refusal
	if errors.As(err, &ref) {
		writeError(w, ref.Status, "%s", ref.Message)
		return
	}
	h.internal(w, what, err)
}

// ApproveRunner approves the named runner if the certificate waiting is the one given: sha256
// (the full one) binds it exactly; a short fingerprint is checked, and the approval is then
// bound to the full SHA-256 of the certificate that matched. app.ApproveShown compares and
// approves under one lock, so nothing can be swapped in between. Refusals are *Refusal.
func (h *API) ApproveRunner(ctx context.Context, name, fingerprint, sha256 string) (*app.Runner, error) {
	shown := app.Shown{CertificateFingerprint: strings.TrimSpace(fingerprint), CertificateSHA256: strings.TrimSpace(sha256)}
	runner, err := h.app.ApproveShown(ctx, name, shown)
	if err != nil {
		return nil, ApproveRefusal(name, err)
	}
	return runner, nil
}

// ApproveRefusal turns what app.ApproveShown refused into a *Refusal naming the field.
func ApproveRefusal(name string, err error) error {
	var ch *app.ChangedError
	switch {
	case errors.As(err, &ch) && ch.Field == "certificate_fingerprint" && ch.Now.PendingCertificate == nil:
		return Refuse(http.StatusConflict, "runner %q has no certificate waiting for approval, so certificate_fingerprint %s cannot match", name, config.Quote(ch.Shown))
	case errors.As(err, &ch) && ch.Field == "certificate_fingerprint":
		return Refuse(http.StatusConflict, "certificate_fingerprint: the certificate waiting for runner %q is %s, not %s: compare again with the RTE's log before approving",
			name, protocol.CertificateFingerprint(ch.Now.PendingCertificate), config.Quote(ch.Shown))
	case errors.Is(err, app.ErrCertificateChanged):
		return Refuse(http.StatusConflict, "certificate_sha256: %v", err)
	case errors.Is(err, app.ErrNotFound):
		return Refuse(http.StatusNotFound, "no runner named %s: GET /api/v2/runners lists them", config.Quote(name))
	}
	// Approve refuses an https:// runner without a certificate waiting, and a sha256 that is
	// not a full one; anything else is the store's, and its text says so.
	return Refuse(http.StatusConflict, "%v", err)
}

// clearWaiting rejects every registration request no admin has decided on yet (app.ClearWaiting):
// the way out when someone filled the waiting slots.
func (h *API) clearWaiting(w http.ResponseWriter, r *http.Request) {
	var body ClearWaitingRequest
	if !decodeOptionalBody(w, r, &body) {
		return
	}
	reason := body.Reason
	if strings.TrimSpace(reason) == "" {
		reason = "an admin cleared the waiting registration requests"
	}
	names, err := h.app.ClearWaiting(r.Context(), reason)
	if err != nil {
		h.internal(w, "clear waiting requests", err)
		return
	}
	if names == nil {
		names = []string{}
	}
	writeJSON(w, http.StatusOK, ClearWaitingResponse{Cleared: names})
}

func (h *API) reject(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var body RejectRequest
	if !decodeOptionalBody(w, r, &body) {
		return
	}
	if err := h.app.Reject(r.Context(), name, body.Reason); err != nil {
		if errors.Is(err, app.ErrNotFound) {
			writeError(w, http.StatusNotFound, "no runner named %s", config.Quote(name))
			return
		}
		h.internal(w, "reject runner", err)
		return
	}
	writeJSON(w, http.StatusOK, RejectResponse{Rejected: name})
}

// LookupRunner returns the named runner; an unknown name is a 404 *Refusal.
func (h *API) LookupRunner(ctx context.Context, name string) (*app.Runner, error) {
	runners, err := h.app.ListRunners(ctx)
	if err != nil {
		return nil, fmt.Errorf("list runners: %w", err)
	}
	for _, rn := range runners {
		if rn.Name == name {
			return rn, nil
		}
	}
	return nil, Refuse(http.StatusNotFound, "no runner named %s: GET /api/v2/runners lists them", config.Quote(name))
}

func (h *API) submit(w http.ResponseWriter, r *http.Request) {
	var body JobRequest
	if !decodeBody(w, r, MaxJobBody, &body, true) {
		return
	}
	job, err := h.SubmitJob(r.Context(), body)
	if err != nil {
		h.writeFailure(w, "submit job", err)
		return
	}
	w.Header().Set("Location", "/api/v2/jobs/"+job.ID)
	writeJSON(w, http.StatusCreated, NewJobView(job))
}

// SubmitJob checks a job request and queues it. Refusals (bad input, a runner that is
// unknown, not approved or unable to take the job) are *Refusal naming the field.
func (h *API) SubmitJob(ctx context.Context, body JobRequest) (*app.Job, error) {
	req, err := body.toJobRequest()
	if err != nil {
		return nil, Refuse(http.StatusBadRequest, "%v", err)
	}
	job, err := h.app.Submit(ctx, req)
	var fe *protocol.FieldError
	var re *app.RefusedError
	switch {
	case err == nil:
		return job, nil
	case errors.As(err, &fe):
		return nil, Refuse(http.StatusBadRequest, "%s: %s", fe.Field, fe.Reason)
	case errors.Is(err, app.ErrInvalidJob):
		return nil, Refuse(http.StatusBadRequest, "%v", err)
	case errors.Is(err, app.ErrNotFound):
		return nil, Refuse(http.StatusBadRequest, "runner: no runner named %s: GET /api/v2/runners lists them", config.Quote(req.Runner))
	case errors.Is(err, app.ErrNotApproved) && errors.As(err, &re):
		return nil, Refuse(http.StatusConflict, "runner: %s is %s, not approved: approve it first (POST /api/v2/runners/%s/approve)", config.Quote(req.Runner), re.State, req.Runner)
	case errors.Is(err, app.ErrNoFiles):
		return nil, Refuse(http.StatusConflict, "runner: %s takes its files from the app (RTE_FILES=transfer), and this app has none to send: set APP_PLAYBOOKS_PATH (and APP_INVENTORY_PATH) on the app, or start the RTE with RTE_FILES=local, ANSIBLE_PATH and REPO_PATH", config.Quote(req.Runner))
	case errors.Is(err, app.ErrRefused):
		return nil, Refuse(http.StatusConflict, "%v", err)
	}
	return nil, err
}

// toJobRequest checks the body and turns it into what app.Submit takes. An error names the
// field and says what is wanted.
func (b JobRequest) toJobRequest() (app.JobRequest, error) {
	if strings.TrimSpace(b.Runner) == "" {
		return app.JobRequest{}, errors.New("runner: is required: name an approved runner (GET /api/v2/runners lists them)")
	}
	if strings.TrimSpace(b.Playbook) == "" {
		return app.JobRequest{}, errors.New("playbook: is required: a path under the runner's ANSIBLE_PATH, such as site.yml")
	}
	for i, inv := range b.Inventories {
		if strings.TrimSpace(inv) == "" {
			return app.JobRequest{}, fmt.Errorf("inventories[%d]: is empty: give a path under the runner's REPO_PATH", i)
		}
	}
	if len(b.Extravars) > 0 {
		var obj map[string]json.RawMessage
		if t := bytes.TrimSpace(b.Extravars); !bytes.Equal(t, []byte("null")) {
			if err := json.Unmarshal(t, &obj); err != nil {
				return app.JobRequest{}, errors.New("extravars: must be a JSON object, such as {\"version\": \"1.2\"}")
			}
		}
	}
	if b.TimeoutS < 0 || b.TimeoutS > protocol.MaxTimeoutS {
		return app.JobRequest{}, fmt.Errorf("timeout_s: is %d; give the seconds the playbook may run, at most %d (7 days), or 0 for the runner's default", b.TimeoutS, protocol.MaxTimeoutS)
	}
	start := b.start()
	if b.Secrets != nil {
		start.Secrets = map[string]string{}
		if b.Secrets.VaultPassword != "" {
			start.Secrets["vault_password"] = b.Secrets.VaultPassword
		}
		if b.Secrets.BecomePassword != "" {
			start.Secrets["become_password"] = b.Secrets.BecomePassword
		}
		if len(start.Secrets) == 0 {
			start.Secrets = nil
		}
	}
	return app.JobRequest{Runner: b.Runner, JobStart: start}, nil
}

func (h *API) listJobs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := app.JobFilter{Runner: q.Get("runner"), Limit: defaultListLimit}
	if s := q.Get("state"); s != "" {
		for _, st := range strings.Split(s, ",") {
			switch js := app.JobState(strings.TrimSpace(st)); js {
			case app.JobQueued, app.JobDispatched, app.JobRunning, app.JobEnded:
				f.States = append(f.States, js)
			default:
				writeError(w, http.StatusBadRequest, "state: %s is not queued, dispatched, running or ended (several may be given, comma-separated)", config.Quote(st))
				return
			}
		}
	}
	limit, ok := intParam(w, r, "limit", defaultListLimit, 1, maxListLimit)
	if !ok {
		return
	}
	f.Limit = int(limit)
	jobs, err := h.app.ListJobs(r.Context(), f)
	if err != nil {
		h.internal(w, "list jobs", err)
		return
	}
	out := JobsResponse{Jobs: make([]JobView, 0, len(jobs))}
	for _, j := range jobs {
		out.Jobs = append(out.Jobs, NewJobView(j))
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *API) getJob(w http.ResponseWriter, r *http.Request) {
	j, ok := h.findJob(w, r)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, NewJobView(j))
}

func (h *API) records(w http.ResponseWriter, r *http.Request) {
	j, ok := h.findJob(w, r)
	if !ok {
		return
	}
	after, ok := intParam(w, r, "after", 0, 0, 1<<62)
	if !ok {
		return
	}
	limit, ok := intParam(w, r, "limit", defaultRecordsLimit, 1, maxRecordsLimit)
	if !ok {
		return
	}
	recs, err := h.app.Records(r.Context(), j.ID, after, int(limit))
	if err != nil {
		h.internal(w, "read records", err)
		return
	}
	if recs == nil {
		recs = []protocol.Record{}
	}
	writeJSON(w, http.StatusOK, RecordsResponse{Records: recs})
}

func (h *API) cancel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := h.app.Cancel(r.Context(), id); err != nil {
		switch {
		case errors.Is(err, app.ErrNotFound):
			writeError(w, http.StatusNotFound, "no job %s", config.Quote(id))
		case errors.Is(err, app.ErrJobEnded):
			writeError(w, http.StatusConflict, "%v", err)
		default:
			h.internal(w, "cancel job", err)
		}
		return
	}
	j, ok := h.findJob(w, r)
	if !ok {
		return
	}
	writeJSON(w, http.StatusAccepted, NewJobView(j))
}

// findJob returns the job named by the path, or answers 404 (or 500) and returns false.
func (h *API) findJob(w http.ResponseWriter, r *http.Request) (*app.Job, bool) {
	id := r.PathValue("id")
	j, err := h.app.GetJob(r.Context(), id)
	if err != nil {
		if errors.Is(err, app.ErrNotFound) {
			writeError(w, http.StatusNotFound, "no job %s: GET /api/v2/jobs lists them", config.Quote(id))
		} else {
			h.internal(w, "get job", err)
		}
		return nil, false
	}
	return j, true
}

// internal answers 500 and logs the cause; the client gets what failed, not the details.
func (h *API) internal(w http.ResponseWriter, what string, err error) {
	if errors.Is(err, context.Canceled) {
		// The client went away; nobody reads an answer.
		return
	}
	h.log.Error(what+" failed", zap.Error(err))
	writeError(w, http.StatusInternalServerError, "%s failed in the app: its log says why", what)
}
