package protocol

import (
	"bytes"
	"fmt"
	"math"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"
)

var (
	jobIDPattern   = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)
	hashPattern    = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	hex64Pattern   = regexp.MustCompile(`^[0-9a-f]{64}$`)
	featurePattern = regexp.MustCompile(`^[a-z0-9._-]{1,64}$`)
	envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
	maxNameLength  = 128
	// An image reference (name[:tag][@digest]) in the charset Docker and Podman accept, not
	// starting with a separator; the engines check the grammar, this keeps spaces, control
	// characters, quotes and option-like values out of the RTE's logs and API calls.
	imagePattern        = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$`)
	imagePatternPattern = regexp.MustCompile(`^[A-Za-z0-9*][A-Za-z0-9._/:@*-]{0,254}$`)
)

// ValidImage reports whether ref is an image reference the RTE passes to its engine: 1 to 255
// of [A-Za-z0-9._/:@-], starting with a letter or digit.
func ValidImage(ref string) bool { return imagePattern.MatchString(ref) }

// ValidImagePattern reports whether p is an entry of the RTE's image allowlist as hello shows
// it: an image reference in which * may also stand for any characters but "/".
func ValidImagePattern(p string) bool { return imagePatternPattern.MatchString(p) }

// ImageAllowed reports whether a job may name image on an RTE whose hello listed images: an
// entry equal to it, or a pattern matching it, where * stands for any characters but "/" (so
// registry.example/ee-* never lets in a path below it, nor another registry). The RTE decides
// with the same function; the app uses it to refuse at submit what the RTE would refuse.
func ImageAllowed(images []string, image string) bool {
	for _, p := range images {
		if p == image {
			return true
		}
		if ok, err := path.Match(p, image); err == nil && ok {
			return true
		}
	}
	return false
}

// imageRule is how a refusal describes a valid image reference.
const imageRule = "1 to 255 of [A-Za-z0-9._/:@-], starting with a letter or digit (name[:tag] or name@sha256:digest)"

// ValidJobID reports whether id is 1 to 128 of [A-Za-z0-9._-], and not "." or "..". Job ids
// become file names in the spool and the job directory, so nothing else is let through: "."
// and ".." would name the work directory itself or its parent, which the job's cleanup would
// remove.
func ValidJobID(id string) bool {
	return id != "." && id != ".." && jobIDPattern.MatchString(id)
}

// jobIDRule is how a refusal describes a valid job id.
const jobIDRule = `1 to 128 of [A-Za-z0-9._-], and not "." or ".."`

// ValidEnvName reports whether name is 1 to 128 of [A-Za-z_][A-Za-z0-9_]*: a variable name
// every shell and exec accepts. A job's env keys must be such names: "A=B" would be read as
// another variable once joined into the child's environment, and an empty or odd name is a
// mistake the RTE would only find when the job starts. The RTE's RTE_JOB_ENV_ALLOW entries
// follow the same rule.
func ValidEnvName(name string) bool { return envNamePattern.MatchString(name) }

// envNameRule is how a refusal describes a valid env name.
const envNameRule = "1 to 128 of [A-Za-z_][A-Za-z0-9_]*"

// ValidTag reports whether t can go into ansible-playbook's --tags or --skip-tags: the tags
// are passed comma-joined, so a tag with a comma would be split into two, and an empty or
// blank one is ignored by ansible.
func ValidTag(t string) bool { return strings.TrimSpace(t) != "" && !strings.Contains(t, ",") }

// ValidHash reports whether h is "sha256:" and 64 lowercase hex digits.
func ValidHash(h string) bool { return hashPattern.MatchString(h) }

// FieldError names the field that broke the contract.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

func checkJob(field, id string) error {
	if !ValidJobID(id) {
		return fieldErr(field, "%q is not %s", clip(id, 64), jobIDRule)
	}
	return nil
}

func checkHash(field, h string) error {
	if !ValidHash(h) {
		return fieldErr(field, "%q is not sha256: and 64 lowercase hex digits", clip(h, 80))
	}
	return nil
}

func checkOneOf(field, v string, allowed ...string) error {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return fieldErr(field, "%q is not one of %v", clip(v, 64), allowed)
}

func checkName(field, v string) error {
	if v == "" || len(v) > maxNameLength {
		return fieldErr(field, "must be 1 to %d characters", maxNameLength)
	}
	return nil
}

func (m Hello) Validate() error {
	if m.Protocol < 1 {
		return fieldErr("protocol", "must be at least 1, got %d", m.Protocol)
	}
	if err := checkName("name", m.Name); err != nil {
		return err
	}
	if err := checkOneOf("mode", m.Mode, ModeInbound, ModeOutbound); err != nil {
		return err
	}
	if err := checkOneOf("files", m.Files, FilesTransfer, FilesLocal); err != nil {
		return err
	}
	if m.MaxJobs < 0 {
		return fieldErr("max_jobs", "must not be negative")
	}
	for i, j := range m.Running {
		if err := checkJob(fmt.Sprintf("running[%d]", i), j); err != nil {
			return err
		}
	}
	for i, s := range m.Spooled {
		if err := checkJob(fmt.Sprintf("spooled[%d].job", i), s.Job); err != nil {
			return err
		}
		if s.LastSeq < 0 {
			return fieldErr(fmt.Sprintf("spooled[%d].last_seq", i), "must not be negative")
		}
	}
	for i, p := range m.Images {
		if !ValidImagePattern(p) {
			return fieldErr(fmt.Sprintf("images[%d]", i), "%q is not an image reference or pattern (%s, or * for any characters but /)", clip(p, 64), imageRule)
		}
	}
	return nil
}

func (m Welcome) Validate() error {
	if m.Protocol < 1 {
		return fieldErr("protocol", "must be at least 1, got %d", m.Protocol)
	}
	if m.MaxJobs < 0 {
		return fieldErr("max_jobs", "must not be negative")
	}
	for job, seq := range m.Acked {
		if err := checkJob("acked", job); err != nil {
			return err
		}
		if seq < 0 {
			return fieldErr("acked."+job, "must not be negative")
		}
	}
	if len(m.Features) > MaxFeatures {
		return fieldErr("features", "has %d names, the limit is %d", len(m.Features), MaxFeatures)
	}
	for i, f := range m.Features {
		if !featurePattern.MatchString(f) {
			return fieldErr(fmt.Sprintf("features[%d]", i), "%q is not 1 to 64 of [a-z0-9._-]", clip(f, 64))
		}
	}
	return nil
}

func (Approved) Validate() error { return nil }
func (Rejected) Validate() error { return nil }

func (m JobStart) Validate() error {
	if err := checkJob("job", m.Job); err != nil {
		return err
	}
	if m.Playbook == "" {
		return fieldErr("playbook", "must not be empty")
	}
	if m.Files != nil {
		if err := checkHash("files.playbooks.hash", m.Files.Playbooks.Hash); err != nil {
			return err
		}
		if m.Files.Playbooks.Size < 0 {
			return fieldErr("files.playbooks.size", "must not be negative")
		}
		for i, b := range m.Files.Inventories {
			if err := checkHash(fmt.Sprintf("files.inventories[%d].hash", i), b.Hash); err != nil {
				return err
			}
			if b.Size < 0 {
				return fieldErr(fmt.Sprintf("files.inventories[%d].size", i), "must not be negative")
			}
		}
	}
	if len(m.Extravars) > 0 {
		t := bytes.TrimSpace(m.Extravars)
		if !bytes.Equal(t, []byte("null")) && (len(t) == 0 || t[0] != '{') {
			return fieldErr("extravars", "must be a JSON object")
		}
	}
	if m.Verbosity < 0 || m.Verbosity > 6 {
		return fieldErr("verbosity", "must be 0 to 6, got %d", m.Verbosity)
	}
	if m.Forks < 0 {
		return fieldErr("forks", "must not be negative")
	}
	if m.TimeoutS < 0 || m.TimeoutS > MaxTimeoutS {
		return fieldErr("timeout_s", "must be 0 (none) to %d seconds (7 days), got %d", MaxTimeoutS, m.TimeoutS)
	}
	// ansible-playbook reads a limit pattern that starts with @ as a file of patterns and
	// prints what it could not match, so "@/etc/passwd" would copy any file the RTE can read
	// into the job's output. Host patterns have no use for @, so none is let through.
	if strings.ContainsRune(m.Limit, '@') {
		return fieldErr("limit", "%q contains @, which ansible reads as a file on the RTE (@file); list the hosts or groups instead", clip(m.Limit, 64))
	}
	for _, f := range []struct {
		name string
		tags []string
	}{{"tags", m.Tags}, {"skip_tags", m.SkipTags}} {
		for i, t := range f.tags {
			if !ValidTag(t) {
				return fieldErr(fmt.Sprintf("%s[%d]", f.name, i), "%q must be a non-empty tag without commas", clip(t, 64))
			}
		}
	}
	// Sorted, so that a job with several bad names is refused naming the same one every time.
	names := make([]string, 0, len(m.Env))
	for k := range m.Env {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if !ValidEnvName(k) {
			return fieldErr("env", "%q is not a variable name (%s)", clip(k, 64), envNameRule)
		}
	}
	for name := range m.Secrets {
		if err := checkOneOf("secrets", name, "vault_password", "become_password"); err != nil {
			return err
		}
	}
	if m.Image != "" && !ValidImage(m.Image) {
		return fieldErr("image", "%q is not an image reference (%s)", clip(m.Image, 64), imageRule)
	}
	return nil
}

func (m JobAccepted) Validate() error { return checkJob("job", m.Job) }

func (m JobRefused) Validate() error {
	if err := checkJob("job", m.Job); err != nil {
		return err
	}
	return checkOneOf("code", m.Code, RefusedFull, RefusedDraining, RefusedNotApproved, RefusedInvalid, RefusedFilesTooLarge, RefusedAlreadyRan)
}

func (m JobCancel) Validate() error { return checkJob("job", m.Job) }

func (m BundleWant) Validate() error {
	if err := checkJob("job", m.Job); err != nil {
		return err
	}
	for i, h := range m.Hashes {
		if err := checkHash(fmt.Sprintf("hashes[%d]", i), h); err != nil {
			return err
		}
	}
	for i, h := range m.Frames {
		field := fmt.Sprintf("frames[%d]", i)
		if err := checkHash(field, h); err != nil {
			return err
		}
		if !slices.Contains(m.Hashes, h) {
			return fieldErr(field, "%s is not one of hashes: ask for the frames only of a bundle asked for", h)
		}
		if slices.Contains(m.Frames[:i], h) {
			return fieldErr(field, "%s is named twice", h)
		}
	}
	return nil
}

func (m BundleFrames) Validate() error {
	if err := checkHash("hash", m.Hash); err != nil {
		return err
	}
	if m.Size < 0 {
		return fieldErr("size", "must not be negative")
	}
	if len(m.Frames) == 0 || len(m.Frames) > MaxBundleFrames {
		return fieldErr("frames", "has %d frames, want 1 to %d", len(m.Frames), MaxBundleFrames)
	}
	var sum int64
	for i, f := range m.Frames {
		// Each size at most what is left of m.Size, so the sum never overflows.
		if f.Size < 1 || f.Size > m.Size-sum {
			return fieldErr(fmt.Sprintf("frames[%d].size", i), "%d is not 1 to the %d bytes left of the bundle's size %d", f.Size, m.Size-sum, m.Size)
		}
		sum += f.Size
		if !hex64Pattern.MatchString(f.SHA256) {
			return fieldErr(fmt.Sprintf("frames[%d].sha256", i), "%q is not 64 lowercase hex digits", clip(f.SHA256, 80))
		}
	}
	if sum != m.Size {
		return fieldErr("frames", "sizes add up to %d bytes, not to the bundle's size %d", sum, m.Size)
	}
	return nil
}

func (m BundleRanges) Validate() error {
	if err := checkJob("job", m.Job); err != nil {
		return err
	}
	if err := checkHash("hash", m.Hash); err != nil {
		return err
	}
	if len(m.Ranges) > MaxBundleFrames {
		return fieldErr("ranges", "has %d ranges, the limit is %d", len(m.Ranges), MaxBundleFrames)
	}
	var end int64 // where the previous range ended
	for i, r := range m.Ranges {
		if r.Offset < end {
			return fieldErr(fmt.Sprintf("ranges[%d].offset", i), "%d is before the end of the previous range (%d): ranges must be in order and must not overlap", r.Offset, end)
		}
		if r.Size < 1 || r.Size > math.MaxInt64-r.Offset {
			return fieldErr(fmt.Sprintf("ranges[%d].size", i), "%d must be at least 1 and end before 2^63", r.Size)
		}
		end = r.Offset + r.Size
	}
	return nil
}

func (m BundleEnd) Validate() error {
	if err := checkHash("hash", m.Hash); err != nil {
		return err
	}
	if m.Size < 0 {
		return fieldErr("size", "must not be negative")
	}
	return nil
}

func (m BundleMissing) Validate() error { return checkHash("hash", m.Hash) }

func (m Record) Validate() error {
	if err := checkJob("job", m.Job); err != nil {
		return err
	}
	if m.Seq < 1 {
		return fieldErr("seq", "must be at least 1, got %d", m.Seq)
	}
	if err := checkOneOf("kind", m.Kind, KindStart, KindOutput, KindEvents, KindLog, KindEnd); err != nil {
		return err
	}
	t := bytes.TrimSpace(m.Data)
	if len(t) == 0 || t[0] != '{' {
		return fieldErr("data", "must be a JSON object")
	}
	return nil
}

func (m Ack) Validate() error {
	if err := checkJob("job", m.Job); err != nil {
		return err
	}
	if m.Seq < 0 {
		return fieldErr("seq", "must not be negative")
	}
	return nil
}

func (m Capacity) Validate() error {
	if m.Running < 0 || m.MaxJobs < 0 {
		return fieldErr("running", "running and max_jobs must not be negative")
	}
	return nil
}

func (m Settings) Validate() error {
	if m.MaxJobs < 0 {
		return fieldErr("max_jobs", "must not be negative")
	}
	return nil
}

func (m Check) Validate() error {
	if err := checkName("id", m.ID); err != nil {
		return err
	}
	if m.TimeoutMS < 0 {
		return fieldErr("timeout_ms", "must not be negative")
	}
	for i, t := range m.Targets {
		f := fmt.Sprintf("targets[%d]", i)
		if t.Host == "" {
			return fieldErr(f+".host", "must not be empty")
		}
		if t.Port < 0 || t.Port > 65535 {
			return fieldErr(f+".port", "must be 0 to 65535, got %d", t.Port)
		}
		if err := checkOneOf(f+".transport", t.Transport, TransportSSH, TransportWinRM); err != nil {
			return err
		}
	}
	return nil
}

func (m CheckResult) Validate() error {
	if err := checkName("id", m.ID); err != nil {
		return err
	}
	for i, r := range m.Results {
		if err := checkOneOf(fmt.Sprintf("results[%d].status", i), r.Status,
			CheckConnected, CheckUnreachable, CheckAuthFailed, CheckHostKeyUnknown, CheckHostKeyMismatch, CheckTimeout); err != nil {
			return err
		}
	}
	return nil
}

func (m Error) Validate() error {
	if m.Code == "" {
		return fieldErr("code", "must not be empty")
	}
	return nil
}
