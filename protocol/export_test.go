package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// DecodeReference is Decode as it was written before scanTop: a map of every key first, then
// the typed struct. It is slow but plainly right, so the fuzz test holds Decode to it exactly.
// The changes from the original are the deliberate ones: "type": null is missing_field, and
// a frame nested too deep says so.
func DecodeReference(data []byte) (Message, error) {
	if len(data) > MaxMessageBytes {
		return nil, &DecodeError{Code: ErrTooLarge, Message: fmt.Sprintf("message is %d bytes, the limit is %d", len(data), MaxMessageBytes)}
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil || fields == nil {
		if err != nil && strings.Contains(err.Error(), "exceeded max depth") {
			return nil, &DecodeError{Code: ErrBadJSON, Message: fmt.Sprintf("JSON nested deeper than %d levels: flatten the message", maxNestingDepth)}
		}
		return nil, &DecodeError{Code: ErrBadJSON, Message: "not a JSON object: send one JSON object per text frame"}
	}
	ref := ""
	for _, k := range []string{"job", "id", "hash"} {
		var s string
		if raw, ok := fields[k]; ok && json.Unmarshal(raw, &s) == nil {
			ref = clip(s, 128)
			break
		}
	}
	var typ string
	rawType, ok := fields["type"]
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
		v, ok := fields[k]
		if !ok || bytes.Equal(v, []byte("null")) {
			return nil, &DecodeError{Code: ErrMissingField, Message: fmt.Sprintf("%s: %s is required", typ, k), Ref: ref, Type: typ}
		}
	}
	m := s.new()
	if err := json.Unmarshal(data, m); err != nil {
		var te *json.UnmarshalTypeError
		msg := err.Error()
		if errors.As(err, &te) {
			msg = fmt.Sprintf("%s: %s must be %s, not %s", typ, te.Field, te.Type, te.Value)
		}
		return nil, &DecodeError{Code: ErrBadField, Message: clip(msg, 300), Ref: ref, Type: typ}
	}
	if err := m.Validate(); err != nil {
		return nil, &DecodeError{Code: ErrInvalid, Message: typ + ": " + err.Error(), Ref: ref, Type: typ}
	}
	return m, nil
}
