package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// spec lists, per message type, how to make an empty value and which keys must be present.
// A key that is present with the wrong JSON type is caught by encoding/json; a key that is
// absent would silently become a zero value, so presence is checked here.
var spec = map[string]struct {
	new      func() Message
	required []string
}{
	TypeHello:         {func() Message { return &Hello{} }, []string{"protocol", "name", "version", "mode", "files", "max_jobs"}},
	TypeWelcome:       {func() Message { return &Welcome{} }, []string{"protocol", "node", "approved"}},
	TypeApproved:      {func() Message { return &Approved{} }, nil},
	TypeRejected:      {func() Message { return &Rejected{} }, nil},
	TypeJobStart:      {func() Message { return &JobStart{} }, []string{"job", "playbook"}},
	TypeJobAccepted:   {func() Message { return &JobAccepted{} }, []string{"job"}},
	TypeJobRefused:    {func() Message { return &JobRefused{} }, []string{"job", "code", "message"}},
	TypeJobCancel:     {func() Message { return &JobCancel{} }, []string{"job"}},
	TypeBundleWant:    {func() Message { return &BundleWant{} }, []string{"job", "hashes"}},
	TypeBundleEnd:     {func() Message { return &BundleEnd{} }, []string{"hash", "size"}},
	TypeBundleMissing: {func() Message { return &BundleMissing{} }, []string{"hash", "reason"}},
	TypeBundleFrames:  {func() Message { return &BundleFrames{} }, []string{"hash", "size", "frames"}},
	TypeBundleRanges:  {func() Message { return &BundleRanges{} }, []string{"job", "hash", "ranges"}},
	TypeRecord:        {func() Message { return &Record{} }, []string{"job", "seq", "kind", "at", "data"}},
	TypeAck:           {func() Message { return &Ack{} }, []string{"job", "seq"}},
	TypeCapacity:      {func() Message { return &Capacity{} }, []string{"running", "max_jobs", "draining"}},
	TypeSettings:      {func() Message { return &Settings{} }, []string{"max_jobs"}},
	TypeCheck:         {func() Message { return &Check{} }, []string{"id", "targets", "timeout_ms"}},
	TypeCheckResult:   {func() Message { return &CheckResult{} }, []string{"id", "results"}},
	TypeError:         {func() Message { return &Error{} }, []string{"code", "message"}},
}

// Types lists every message type this version knows.
func Types() []string {
	out := make([]string, 0, len(spec))
	for t := range spec {
		out = append(out, t)
	}
	return out
}

// DecodeError is bad input: it carries the code and reference for the error message that
// answers it, so the receiver can reply and keep the socket open.
type DecodeError struct {
	Code    string // one of the Err* codes
	Message string
	Ref     string // the job or request id, when one could be read
	Type    string // the message type, when one could be read
}

func (e *DecodeError) Error() string { return e.Code + ": " + e.Message }

// Reply is the error message that answers e.
func (e *DecodeError) Reply() Error { return Error{Code: e.Code, Message: e.Message, Ref: e.Ref} }

// Decode parses one text frame into its typed message (a pointer, such as *Hello) and checks it
// against the contract. Every failure is a *DecodeError. Unknown keys are ignored.
func Decode(data []byte) (Message, error) {
	if len(data) > MaxMessageBytes {
		return nil, &DecodeError{Code: ErrTooLarge, Message: fmt.Sprintf("message is %d bytes, the limit is %d", len(data), MaxMessageBytes)}
	}
	top, ok, tooDeep := scanTopDepth(data)
	if tooDeep {
		return nil, &DecodeError{Code: ErrBadJSON, Message: fmt.Sprintf("JSON nested deeper than %d levels: flatten the message", maxNestingDepth)}
	}
	if !ok {
		return nil, &DecodeError{Code: ErrBadJSON, Message: "not a JSON object: send one JSON object per text frame"}
	}
	ref := top.ref()
	var typ string
	rawType, ok := top.get("type")
	if !ok || bytes.Equal(rawType, []byte("null")) {
		return nil, &DecodeError{Code: ErrMissingField, Message: "type: missing", Ref: ref}
	}
	if err := json.Unmarshal(rawType, &typ); err != nil {
		return nil, &DecodeError{Code: ErrBadField, Message: "type: not a string", Ref: ref}
	}
	s, ok := spec[typ]
	if !ok {
		return nil, &DecodeError{Code: ErrUnknownType, Message: fmt.Sprintf("type %q is not a protocol v%d message", clip(typ, 64), Version), Ref: ref}
	}
	for _, k := range s.required {
		v, ok := top.get(k)
		if !ok || bytes.Equal(v, []byte("null")) {
			return nil, &DecodeError{Code: ErrMissingField, Message: fmt.Sprintf("%s: %s is required", typ, k), Ref: ref, Type: typ}
		}
	}
	var m Message
	if typ == TypeRecord {
		if r, ok := decodeRecord(&top); ok {
			m = r
		}
	}
	if m == nil {
		m = s.new()
		if err := json.Unmarshal(data, m); err != nil {
			var te *json.UnmarshalTypeError
			msg := err.Error()
			if errors.As(err, &te) {
				msg = fmt.Sprintf("%s: %s must be %s, not %s", typ, te.Field, te.Type, te.Value)
			}
			return nil, &DecodeError{Code: ErrBadField, Message: clip(msg, 300), Ref: ref, Type: typ}
		}
	}
	if err := m.Validate(); err != nil {
		return nil, &DecodeError{Code: ErrInvalid, Message: typ + ": " + err.Error(), Ref: ref, Type: typ}
	}
	return m, nil
}

// Encode turns a message into one text frame with its "type" key first.
func Encode(m Message) ([]byte, error) {
	switch r := m.(type) {
	case *Record:
		return encodeRecord(r)
	case Record:
		return encodeRecord(&r)
	}
	body, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", m.Type(), err)
	}
	typ, _ := json.Marshal(m.Type())
	out := make([]byte, 0, len(body)+len(typ)+10)
	out = append(out, `{"type":`...)
	out = append(out, typ...)
	if len(body) > 2 { // body is "{...}"; "{}" adds nothing
		out = append(out, ',')
		out = append(out, body[1:]...)
	} else {
		out = append(out, '}')
	}
	return out, nil
}

// encodeRecord writes a record by hand. Records carry the volume (every 64 KiB of a job's
// output is one), and encoding/json would compact the raw data, a full scan and copy that cost
// the RTE a third of its CPU; the data is checked with the same fast scanner Decode uses and
// copied as it is.
func encodeRecord(r *Record) ([]byte, error) {
	s := jsonScanner{data: r.Data}
	s.space()
	if s.peek() != '{' || !s.object(nil) {
		return nil, fmt.Errorf("encode record %s/%d: data is not a JSON object", clip(r.Job, 64), r.Seq)
	}
	s.space()
	if s.pos != len(r.Data) {
		return nil, fmt.Errorf("encode record %s/%d: data has bytes after its JSON object", clip(r.Job, 64), r.Seq)
	}
	job, err := json.Marshal(r.Job)
	if err != nil {
		return nil, err
	}
	kind, err := json.Marshal(r.Kind)
	if err != nil {
		return nil, err
	}
	at, err := r.At.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("encode record %s/%d: %w", clip(r.Job, 64), r.Seq, err)
	}
	out := make([]byte, 0, len(r.Data)+len(job)+len(kind)+len(at)+64)
	out = append(out, `{"type":"record","job":`...)
	out = append(out, job...)
	out = append(out, `,"seq":`...)
	out = strconv.AppendInt(out, r.Seq, 10)
	out = append(out, `,"kind":`...)
	out = append(out, kind...)
	out = append(out, `,"at":`...)
	out = append(out, at...)
	out = append(out, `,"data":`...)
	out = append(out, r.Data...)
	out = append(out, '}')
	return out, nil
}
