package protocol

import (
	"encoding/json"
	"time"
)

// Message types, the "type" key of every text frame.
const (
	TypeHello         = "hello"
	TypeWelcome       = "welcome"
	TypeApproved      = "approved"
	TypeRejected      = "rejected"
	TypeJobStart      = "job.start"
	TypeJobAccepted   = "job.accepted"
	TypeJobRefused    = "job.refused"
	TypeJobCancel     = "job.cancel"
	TypeBundleWant    = "bundle.want"
	TypeBundleEnd     = "bundle.end"
	TypeBundleMissing = "bundle.missing"
	TypeBundleFrames  = "bundle.frames"
	TypeBundleRanges  = "bundle.ranges"
	TypeRecord        = "record"
	TypeAck           = "ack"
	TypeCapacity      = "capacity"
	TypeSettings      = "settings"
	TypeCheck         = "check"
	TypeCheckResult   = "check.result"
	TypeError         = "error"
)

// Message is one JSON text frame. Type names the "type" key it travels under.
type Message interface {
	Type() string
	// Validate reports the first value that breaks the contract, naming the field.
	Validate() error
}

// Ref is the job, request or bundle a message is about: what an Error answering it names in
// its ref, so the peer can tell which of its messages was refused. "" for messages about the
// socket as a whole.
func Ref(m Message) string {
	switch m := m.(type) {
	case *Check:
		return m.ID
	case *CheckResult:
		return m.ID
	case *BundleEnd:
		return m.Hash
	case *BundleMissing:
		return m.Hash
	case *BundleFrames:
		return m.Hash
	case *BundleRanges:
		return m.Hash
	case *BundleWant:
		return m.Job
	case *Record:
		return m.Job
	case *JobAccepted:
		return m.Job
	case *JobRefused:
		return m.Job
	case *JobCancel:
		return m.Job
	case *JobStart:
		return m.Job
	}
	return ""
}

// Hello is the RTE's first message on every socket.
type Hello struct {
	Protocol         int          `json:"protocol"`
	Name             string       `json:"name"`
	Version          string       `json:"version"`
	Instance         string       `json:"instance"`
	Mode             string       `json:"mode"`
	Files            string       `json:"files"`
	MaxJobs          int          `json:"max_jobs"`
	Running          []string     `json:"running"`
	Spooled          []SpooledJob `json:"spooled"`
	TokenFingerprint string       `json:"token_fingerprint"`
	AnsibleVersion   string       `json:"ansible_version"`
	// Images are the job images a job.start may name (JobStart.Image), for the app to offer:
	// the RTE's default (RTE_IMAGE) first, then RTE_IMAGES_ALLOW's entries as the operator
	// wrote them, where * stands for any characters but "/". Absent when the RTE runs jobs as
	// processes: a job.start naming an image is then refused. Optional.
	Images []string `json:"images,omitempty"`
}

// SpooledJob names a job with records in the RTE's spool and the highest seq it holds.
type SpooledJob struct {
	Job     string `json:"job"`
	LastSeq int64  `json:"last_seq"`
}

// Welcome is the app's answer to hello.
type Welcome struct {
	Protocol int    `json:"protocol"`
	Node     string `json:"node"`
	Approved bool   `json:"approved"`
	// MaxJobs 0 means "use RTE_MAX_JOBS".
	MaxJobs int `json:"max_jobs"`
	// Acked maps job ids to the highest seq the app has stored; optional.
	Acked map[string]int64 `json:"acked,omitempty"`
	// Features names the protocol additions the app speaks (FeatureBundleFrames); the RTE
	// uses an addition only when the app names it. Unknown names are ignored. Optional.
	Features []string `json:"features,omitempty"`
}

// FeatureBundleFrames, in welcome.features, says the app answers bundle.want's frames with
// bundle.frames and then sends the byte ranges bundle.ranges asks for.
const FeatureBundleFrames = "bundle.frames"

// HasFeature reports whether the welcome names feature.
func (m Welcome) HasFeature(feature string) bool {
	for _, f := range m.Features {
		if f == feature {
			return true
		}
	}
	return false
}

// Approved tells a waiting outbound RTE that an admin approved it.
type Approved struct{}

// Rejected tells a waiting RTE that an admin rejected it; the app closes with 4003 after it.
type Rejected struct {
	Reason string `json:"reason,omitempty"`
}

// JobStart hands a job to the RTE with everything it needs.
type JobStart struct {
	Job         string            `json:"job"`
	Playbook    string            `json:"playbook"`
	Inventories []string          `json:"inventories,omitempty"`
	Files       *JobFiles         `json:"files,omitempty"`
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
	// Secrets maps a secret's name (vault_password, become_password) to its sealed value.
	Secrets map[string]string `json:"secrets,omitempty"`
	// Image is the job image (execution environment) to run the job in, one the RTE's hello
	// lists; empty runs it in the RTE's default. Optional.
	Image string `json:"image,omitempty"`
}

// JobFiles names the bundles of a transfer-mode job.
type JobFiles struct {
	Playbooks   BundleRef   `json:"playbooks"`
	Inventories []BundleRef `json:"inventories,omitempty"`
}

// BundleRef names a bundle by the sha256 of its compressed bytes, and gives its size in bytes.
type BundleRef struct {
	Hash string `json:"hash"`
	Size int64  `json:"size"`
}

// JobAccepted says the RTE has the job (new, running or spooled).
type JobAccepted struct {
	Job string `json:"job"`
}

// Refusal codes of job.refused.
const (
	RefusedFull          = "full"
	RefusedDraining      = "draining"
	RefusedNotApproved   = "not_approved"
	RefusedInvalid       = "invalid"
	RefusedFilesTooLarge = "files_too_large"
	// RefusedAlreadyRan: the job id already ran on this RTE and the app stored its end; a job
	// id is used once. The RTE remembers such ids for jobs.RanRetention (7 days), across
	// restarts.
	RefusedAlreadyRan = "already_ran"
)

// JobRefused says the RTE will not run the job, and why.
type JobRefused struct {
	Job     string `json:"job"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// JobCancel asks the RTE to stop a job's whole process group.
type JobCancel struct {
	Job string `json:"job"`
}

// BundleWant names the bundles a job needs that the RTE's cache lacks.
type BundleWant struct {
	Job    string   `json:"job"`
	Hashes []string `json:"hashes"`
	// Frames names those of Hashes for which the RTE wants the frame index (bundle.frames)
	// first instead of the bytes; sent only to an app whose welcome names
	// FeatureBundleFrames. Optional.
	Frames []string `json:"frames,omitempty"`
}

// BundleFrames is the app's frame index of a bundle, in answer to bundle.want's frames: the
// zstd frames the bundle's bytes are cut into, in order. Frame i starts where frame i-1 ends
// (the first at 0), so offsets are implied and frames can neither overlap nor leave gaps.
type BundleFrames struct {
	Hash   string        `json:"hash"`
	Size   int64         `json:"size"`
	Frames []BundleFrame `json:"frames"`
}

// BundleFrame is one zstd frame of a bundle: its compressed size and the SHA-256 of those
// bytes, 64 lowercase hex digits.
type BundleFrame struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// BundleRanges asks the app for the byte ranges of a bundle that the RTE could not fill from
// frames it already holds, after bundle.frames. The app sends chunks covering exactly those
// ranges, then bundle.end; no ranges means bundle.end alone.
type BundleRanges struct {
	Job    string      `json:"job"`
	Hash   string      `json:"hash"`
	Ranges []ByteRange `json:"ranges"`
}

// ByteRange is Size bytes of a bundle from Offset.
type ByteRange struct {
	Offset int64 `json:"offset"`
	Size   int64 `json:"size"`
}

// BundleEnd follows the last chunk of a bundle.
type BundleEnd struct {
	Hash string `json:"hash"`
	Size int64  `json:"size"`
}

// BundleMissing says the app cannot send a bundle.
type BundleMissing struct {
	Hash   string `json:"hash"`
	Reason string `json:"reason"`
}

// Record kinds.
const (
	KindStart  = "start"
	KindOutput = "output"
	KindEvents = "events"
	KindLog    = "log"
	KindEnd    = "end"
)

// Record is one numbered piece of a job's story. Data's shape depends on Kind (StartData,
// OutputData, EventsData, LogData, EndData); it stays raw so a record passes through the
// spool and the app's store without being decoded and encoded again.
type Record struct {
	Job  string          `json:"job"`
	Seq  int64           `json:"seq"`
	Kind string          `json:"kind"`
	At   time.Time       `json:"at"`
	Data json.RawMessage `json:"data"`
}

// StartData is the data of a start record, always seq 1.
type StartData struct {
	PID      int    `json:"pid"`
	Instance string `json:"instance"`
	Playbook string `json:"playbook"`
	// Image is the job image the job's container runs, with a container engine; absent for a
	// process on the RTE's host. Optional.
	Image string `json:"image,omitempty"`
}

// OutputData is the data of an output record: stdout and stderr as written, valid UTF-8.
type OutputData struct {
	Text string `json:"text"`
}

// EventsData is the data of an events record: ansible-runner shaped events.
type EventsData struct {
	Events []json.RawMessage `json:"events"`
}

// Log levels of a log record.
const (
	LevelInfo  = "info"
	LevelWarn  = "warn"
	LevelError = "error"
)

// LogData is the data of a log record: what the RTE itself says about the job.
type LogData struct {
	Level   string `json:"level"`
	Message string `json:"message"`
}

// End statuses.
const (
	StatusSuccess   = "success"
	StatusFailed    = "failed"
	StatusCanceled  = "canceled"
	StatusAbandoned = "abandoned"
	StatusError     = "error"
	StatusTimeout   = "timeout"
)

// EndData is the data of an end record, always a job's last.
type EndData struct {
	Status   string `json:"status"`
	ExitCode int    `json:"exit_code"`
	Message  string `json:"message,omitempty"`
}

// Ack says every record of Job up to and including Seq is stored.
type Ack struct {
	Job string `json:"job"`
	Seq int64  `json:"seq"`
}

// Capacity reports how busy the RTE is.
type Capacity struct {
	Running  int  `json:"running"`
	MaxJobs  int  `json:"max_jobs"`
	Draining bool `json:"draining"`
}

// Settings applies the runner page's values without a restart.
type Settings struct {
	MaxJobs int `json:"max_jobs"`
}

// Check asks the RTE to try each target once, concurrently, and answer in one check.result.
type Check struct {
	ID        string        `json:"id"`
	Targets   []CheckTarget `json:"targets"`
	TimeoutMS int           `json:"timeout_ms"`
}

// Transports of a check target.
const (
	TransportSSH   = "ssh"
	TransportWinRM = "winrm"
)

// CheckTarget is one managed host to try.
type CheckTarget struct {
	Name      string `json:"name"`
	Host      string `json:"host"`
	Port      int    `json:"port,omitempty"`
	User      string `json:"user,omitempty"`
	Transport string `json:"transport"`
}

// Check statuses.
const (
	CheckConnected       = "connected"
	CheckUnreachable     = "unreachable"
	CheckAuthFailed      = "auth_failed"
	CheckHostKeyUnknown  = "host_key_unknown"
	CheckHostKeyMismatch = "host_key_mismatch"
	CheckTimeout         = "timeout"
)

// CheckResult answers a check, one entry per target.
type CheckResult struct {
	ID      string         `json:"id"`
	Results []CheckOutcome `json:"results"`
}

// CheckOutcome is one target's result.
type CheckOutcome struct {
	Name      string `json:"name"`
	Host      string `json:"host"`
	Status    string `json:"status"`
	Message   string `json:"message"`
	LatencyMS int64  `json:"latency_ms"`
}

// Error codes of the error message.
const (
	ErrBadJSON      = "bad_json"
	ErrUnknownType  = "unknown_type"
	ErrMissingField = "missing_field"
	ErrBadField     = "bad_field"
	ErrInvalid      = "invalid"
	ErrTooLarge     = "too_large"
	ErrUnexpected   = "unexpected" // valid message, wrong moment or wrong direction
)

// Error answers a bad message; the socket stays open.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Ref     string `json:"ref,omitempty"`
}

func (Hello) Type() string         { return TypeHello }
func (Welcome) Type() string       { return TypeWelcome }
func (Approved) Type() string      { return TypeApproved }
func (Rejected) Type() string      { return TypeRejected }
func (JobStart) Type() string      { return TypeJobStart }
func (JobAccepted) Type() string   { return TypeJobAccepted }
func (JobRefused) Type() string    { return TypeJobRefused }
func (JobCancel) Type() string     { return TypeJobCancel }
func (BundleWant) Type() string    { return TypeBundleWant }
func (BundleEnd) Type() string     { return TypeBundleEnd }
func (BundleMissing) Type() string { return TypeBundleMissing }
func (BundleFrames) Type() string  { return TypeBundleFrames }
func (BundleRanges) Type() string  { return TypeBundleRanges }
func (Record) Type() string        { return TypeRecord }
func (Ack) Type() string           { return TypeAck }
func (Capacity) Type() string      { return TypeCapacity }
func (Settings) Type() string      { return TypeSettings }
func (Check) Type() string         { return TypeCheck }
func (CheckResult) Type() string   { return TypeCheckResult }
func (Error) Type() string         { return TypeError }

// RegisterRequest is the body of POST /api/v2/rte/register.
type RegisterRequest struct {
	Name        string `json:"name"`
	URL         string `json:"url"`
	Token       string `json:"token"`
	Certificate string `json:"certificate,omitempty"` // PEM, present for https:// URLs
	JoinToken   string `json:"join_token,omitempty"`
	Version     string `json:"version"`
	MaxJobs     int    `json:"max_jobs"`
}

// RegisterResponse is the app's answer to a registration; Error is set on 4xx.
type RegisterResponse struct {
	State                  string `json:"state,omitempty"`
	TokenFingerprint       string `json:"token_fingerprint,omitempty"`
	CertificateFingerprint string `json:"certificate_fingerprint,omitempty"`
	Error                  string `json:"error,omitempty"`
}
