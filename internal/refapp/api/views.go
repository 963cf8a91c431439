package api

import (
	"crypto/x509"
	"encoding/json"
	"net"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/protocol"
)

// The admin API's JSON shapes. The server builds them from package app's types and the CLI
// decodes them, so both sides share one definition. None of them carries a token or a
// secret's value: a runner shows its token's fingerprint, a job the names of its secrets.

// RunnerView is one runner in GET /api/v2/runners.
type RunnerView struct {
	Name  string `json:"name"`
	URL   string `json:"url,omitempty"`
	Mode  string `json:"mode"`
	Files string `json:"files,omitempty"`
	State string `json:"state"`

	TokenFingerprint string `json:"token_fingerprint"`
	// Certificate is the pinned one: the app dials only a runner that presents it.
	Certificate *CertificateView `json:"certificate,omitempty"`
	// PendingCertificate waits for an admin who compares its fingerprint with the RTE's log.
	PendingCertificate *CertificateView `json:"pending_certificate,omitempty"`
	// ExpectedSHA256 is the full fingerprint a runner added by hand was given, pinned when the
	// first matching certificate is met.
	ExpectedSHA256 string `json:"expected_certificate_sha256,omitempty"`

	Version     string     `json:"version,omitempty"`
	MaxJobs     int        `json:"max_jobs"`
	RemoteAddr  string     `json:"remote_addr,omitempty"`
	RequestedAt *time.Time `json:"requested_at,omitempty"`
	ApprovedAt  *time.Time `json:"approved_at,omitempty"`
	LastSeen    *time.Time `json:"last_seen,omitempty"`

	// Connected and what follows are live: the socket to the runner, and Node the app node
	// that holds it (this one, or another sharing the database).
	Connected      bool               `json:"connected"`
	Node           string             `json:"node,omitempty"`
	Capacity       *protocol.Capacity `json:"capacity,omitempty"`
	Instance       string             `json:"instance,omitempty"`
	AnsibleVersion string             `json:"ansible_version,omitempty"`
	// Images are the job images the runner allows (hello.images): its default first.
	Images []string `json:"images,omitempty"`
}

// CertificateView shows a certificate the way an admin compares it with the RTE's log line.
type CertificateView struct {
	Fingerprint string     `json:"fingerprint"` // short, as the RTE logs certificate_fingerprint
	SHA256      string     `json:"sha256"`      // full, as the RTE logs certificate_sha256
	Subject     string     `json:"subject,omitempty"`
	DNSNames    []string   `json:"dns_names,omitempty"`
	IPAddresses []string   `json:"ip_addresses,omitempty"`
	NotAfter    *time.Time `json:"not_after,omitempty"`
}

func NewRunnerView(r *app.Runner, st app.RunnerStatus, live bool) RunnerView {
	v := RunnerView{
		Name: r.Name, URL: r.URL, Mode: r.Mode, Files: r.Files, State: string(r.State),
		TokenFingerprint:   r.TokenFingerprint,
		Certificate:        newCertificateView(r.Certificate),
		PendingCertificate: newCertificateView(r.PendingCertificate),
		Version:            r.Version,
		MaxJobs:            r.MaxJobs,
		RemoteAddr:         r.RemoteAddr,
		RequestedAt:        timeOrNil(r.RequestedAt),
		ApprovedAt:         timeOrNil(r.ApprovedAt),
		LastSeen:           timeOrNil(r.LastSeen),
	}
	if r.Certificate == nil {
		v.ExpectedSHA256 = r.CertificateSHA256
	}
	if live && st.Connected {
		v.Connected = true
		v.Node = st.Node
	}
	// A socket at another app node is known here by its lease alone; its capacity and hello
	// are that node's to show.
	if live && st.Connected && !st.Remote {
		capacity := st.Capacity
		v.Capacity = &capacity
		v.Instance = st.Hello.Instance
		v.AnsibleVersion = st.Hello.AnsibleVersion
		v.Images = st.Hello.Images
		if st.Hello.Version != "" {
			v.Version = st.Hello.Version
		}
	}
	return v
}

func newCertificateView(der []byte) *CertificateView {
	if der == nil {
		return nil
	}
	v := &CertificateView{Fingerprint: protocol.CertificateFingerprint(der), SHA256: protocol.CertificateSHA256(der)}
	if c, err := x509.ParseCertificate(der); err == nil {
		v.Subject = c.Subject.String()
		v.DNSNames = c.DNSNames
		for _, ip := range c.IPAddresses {
			v.IPAddresses = append(v.IPAddresses, net.IP(ip).String())
		}
		v.NotAfter = timeOrNil(c.NotAfter.UTC())
	}
	return v
}

// JobView is one job in the admin API.
type JobView struct {
	ID              string     `json:"id"`
	Runner          string     `json:"runner"`
	State           string     `json:"state"`
	Status          string     `json:"status,omitempty"`
	ExitCode        int        `json:"exit_code"`
	Message         string     `json:"message,omitempty"`
	CancelRequested bool       `json:"cancel_requested,omitempty"`
	CreatedAt       time.Time  `json:"created_at"`
	DispatchedAt    *time.Time `json:"dispatched_at,omitempty"`
	StartedAt       *time.Time `json:"started_at,omitempty"`
	EndedAt         *time.Time `json:"ended_at,omitempty"`
	// LastSeq is the last record stored with none missing before it.
	LastSeq int64 `json:"last_seq"`

	JobOptions
	// Secrets names the secrets the job was given; their values are never shown.
	Secrets []string `json:"secrets,omitempty"`
}

func NewJobView(j *app.Job) JobView {
	return JobView{
		ID: j.ID, Runner: j.Runner, State: string(j.State), Status: j.Status, ExitCode: j.ExitCode,
		Message: j.Message, CancelRequested: j.CancelRequested, CreatedAt: j.CreatedAt,
		DispatchedAt: timeOrNil(j.DispatchedAt), StartedAt: timeOrNil(j.StartedAt), EndedAt: timeOrNil(j.EndedAt),
		LastSeq: j.LastSeq, JobOptions: optionsOf(j.Start), Secrets: j.SecretNames,
	}
}

// JobRequest is the body of POST /api/v2/jobs: the job.start fields an admin chooses, with
// secrets in plaintext (the app seals them for the runner at dispatch and never stores them).
type JobRequest struct {
	Runner string `json:"runner"`
	JobOptions
	Secrets *JobSecrets `json:"secrets,omitempty"`
}

// JobOptions are the job.start fields an admin chooses and the API shows back, in both
// JobRequest and JobView (embedded, so their JSON keys stand at the top level of each).
type JobOptions struct {
	Playbook    string            `json:"playbook"`
	Inventories []string          `json:"inventories,omitempty"`
	Extravars   json.RawMessage   `json:"extravars,omitempty"`
	Limit       string            `json:"limit,omitempty"`
	Tags        []string          `json:"tags,omitempty"`
	SkipTags    []string          `json:"skip_tags,omitempty"`
	Check       bool              `json:"check,omitempty"`
	Diff        bool              `json:"diff,omitempty"`
	Verbosity   int               `json:"verbosity,omitempty"`
	Forks       int               `json:"forks,omitempty"`
	TimeoutS    int               `json:"timeout_s,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
}

func optionsOf(s protocol.JobStart) JobOptions {
	return JobOptions{
		Playbook: s.Playbook, Inventories: s.Inventories, Extravars: s.Extravars, Limit: s.Limit,
		Tags: s.Tags, SkipTags: s.SkipTags, Check: s.Check, Diff: s.Diff, Verbosity: s.Verbosity,
		Forks: s.Forks, TimeoutS: s.TimeoutS, Env: s.Env,
	}
}

// start is the job.start the options ask for, without an id, files or secrets.
func (o JobOptions) start() protocol.JobStart {
	return protocol.JobStart{
		Playbook: o.Playbook, Inventories: o.Inventories, Extravars: o.Extravars, Limit: o.Limit,
		Tags: o.Tags, SkipTags: o.SkipTags, Check: o.Check, Diff: o.Diff, Verbosity: o.Verbosity,
		Forks: o.Forks, TimeoutS: o.TimeoutS, Env: o.Env,
	}
}

// JobSecrets are the secrets a job may carry, by their protocol names.
type JobSecrets struct {
	VaultPassword  string `json:"vault_password,omitempty"`
	BecomePassword string `json:"become_password,omitempty"`
}

// ApproveRequest is the optional body of POST /api/v2/runners/{name}/approve: with a
// fingerprint, the approval goes through only if the certificate waiting is the one the
// admin compared.
type ApproveRequest struct {
	CertificateFingerprint string `json:"certificate_fingerprint,omitempty"`
	// CertificateSHA256 is the full fingerprint (64 hex digits, as the RTE logs
	// certificate_sha256): it binds the approval to exactly that certificate. The short
	// fingerprint is 32 bits, which a certificate can be ground to match.
	CertificateSHA256 string `json:"certificate_sha256,omitempty"`
}

// ClearWaitingRequest is the optional body of POST /api/v2/runners/clear-waiting.
type ClearWaitingRequest struct {
	Reason string `json:"reason,omitempty"`
}

// ClearWaitingResponse names the registration requests removed.
type ClearWaitingResponse struct {
	Cleared []string `json:"cleared"`
}

// RejectRequest is the optional body of POST /api/v2/runners/{name}/reject.
type RejectRequest struct {
	Reason string `json:"reason,omitempty"`
}

type RunnersResponse struct {
	Runners []RunnerView `json:"runners"`
}

type JobsResponse struct {
	Jobs []JobView `json:"jobs"`
}

type RecordsResponse struct {
	Records []protocol.Record `json:"records"`
}

type RejectResponse struct {
	Rejected string `json:"rejected"`
}

// ErrorResponse is every error's body.
type ErrorResponse struct {
	Error string `json:"error"`
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
