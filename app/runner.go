package app

import (
	"bytes"
	"slices"
	"time"
)

// State is where a runner stands with the admin.
type State string

const (
	// StateWaiting: the runner asked to join, or its certificate changed, and an admin has not
	// decided yet. The app never dials a waiting runner.
	StateWaiting State = "waiting"
	// StateApproved: an admin approved the runner (or the join token did), and the app dials it
	// over the approved certificate.
	StateApproved State = "approved"
	// StateRejected: refused by an admin. Reject removes inbound runners outright, so this state
	// is for halves that keep a record of the refusal (the outbound endpoint).
	StateRejected State = "rejected"
)

// ModeDatabase is the Mode of a runner whose RTE still ran in database mode (7.0 to 7.2), which
// is gone: the app never dials such a runner nor gives it jobs. When its RTE signs in over the
// outbound endpoint with the runner's own token, the runner moves to outbound mode by itself,
// unless the config seed keeps it in database mode (seed.go).
const ModeDatabase = "database"

// Runner is one RTE as the app knows it.
type Runner struct {
	Name  string
	URL   string // inbound: where the app dials (the RTE's RTE_URL); empty for outbound runners
	Mode  string // protocol.ModeInbound, protocol.ModeOutbound, or ModeDatabase
	Files string // protocol.FilesTransfer or protocol.FilesLocal, as the last hello said
	// Images are the job images the runner allows, as its last hello said (hello.images): its
	// RTE_IMAGE first, then RTE_IMAGES_ALLOW's entries. Empty for a runner whose jobs run as
	// processes, and for one never heard since images were stored; Submit checks a job's image
	// against them only when there are some, so an empty list never refuses anything.
	Images []string
	State  State

	// Token is the runner's RTE_TOKEN: the app presents it when dialling, so it is a credential
	// and must never be logged or shown; TokenFingerprint is what people compare.
	Token            string
	TokenFingerprint string

	// Certificate is the DER of the approved certificate: the app dials only a runner that
	// presents exactly these bytes. Nil for an http:// runner, or for a runner added by hand or
	// seed that has not been dialled yet.
	Certificate []byte
	// PendingCertificate waits for an admin: from a first registration, a changed certificate,
	// or the first certificate met when dialling a runner without a pin (trust on first use).
	PendingCertificate []byte
	// CertificateSHA256 is a full fingerprint given with a runner added by hand or seed (64 hex
	// digits): the first certificate that matches it is pinned without asking an admin. Unused
	// once Certificate is set.
	CertificateSHA256 string

	Version string
	// MaxJobs is the runner page's override of RTE_MAX_JOBS, sent in welcome; 0 lets the RTE use
	// its own setting. The max_jobs an RTE reports (registration, hello) is not stored here, or
	// it would freeze the RTE's setting into an override.
	MaxJobs int

	RemoteAddr  string    // where the last registration came from
	RequestedAt time.Time // the last registration, or when the certificate last became pending
	ApprovedAt  time.Time // zero for a runner never approved
	LastSeen    time.Time // the last successful handshake

	// Seeded marks a runner the config seed declares: the seed, not the admin page, is where its
	// mode, address and token change (ApplySeed).
	Seeded bool
}

// Clone returns a deep copy, so that a caller's changes never reach a store's copy.
func (r *Runner) Clone() *Runner {
	c := *r
	c.Certificate = bytes.Clone(r.Certificate)
	c.PendingCertificate = bytes.Clone(r.PendingCertificate)
	c.Images = slices.Clone(r.Images)
	return &c
}
