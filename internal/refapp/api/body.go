// Reading request bodies and parameters, and writing JSON answers, with the bounds and the
// refusal messages every route shares.

package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/internal/refapp/display"
)

// intParam reads an integer query parameter within [lo, hi]; def when absent. On a bad value
// it answers 400 naming the parameter and returns false.
func intParam(w http.ResponseWriter, r *http.Request, name string, def, lo, hi int64) (int64, bool) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, true
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < lo || n > hi {
		writeError(w, http.StatusBadRequest, "%s: %s is not a whole number from %d to %d", name, config.Quote(s), lo, hi)
		return 0, false
	}
	return n, true
}

// decodeBody reads one JSON object of at most limit bytes into v. Unknown fields are refused
// when strict, so a misspelt option ("skiptags") is an error rather than silently ignored.
// On failure it answers 400 (or 413) naming the problem and returns false.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any, strict bool) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	if strict {
		dec.DisallowUnknownFields()
	}
	err := dec.Decode(v)
	if err == nil {
		if _, extra := dec.Token(); extra != io.EOF {
			writeError(w, http.StatusBadRequest, "body: want one JSON object, found more after it")
			return false
		}
		return true
	}
	var (
		tooLarge *http.MaxBytesError
		typeErr  *json.UnmarshalTypeError
		syntax   *json.SyntaxError
	)
	switch {
	case errors.As(err, &tooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, "body: larger than %d bytes; put large data in the repository or the inventory", limit)
	case errors.As(err, &typeErr) && typeErr.Field != "":
		writeError(w, http.StatusBadRequest, "%s: must be a JSON %s, not %s", typeErr.Field, jsonKind(typeErr.Type.Kind().String()), typeErr.Value)
	case errors.As(err, &typeErr):
		writeError(w, http.StatusBadRequest, "body: must be a JSON object, not %s", typeErr.Value)
	case errors.As(err, &syntax):
		writeError(w, http.StatusBadRequest, "body: not valid JSON at byte %d: %v", syntax.Offset, err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		writeError(w, http.StatusBadRequest, "body: not valid JSON: it ends in the middle of a value")
	case errors.Is(err, io.EOF):
		writeError(w, http.StatusBadRequest, "body: empty; send a JSON object")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.TrimPrefix(err.Error(), "json: unknown field ")
		writeError(w, http.StatusBadRequest, "%s: unknown field; docs/reference-app.md lists the fields", strings.Trim(field, `"`))
	default:
		writeError(w, http.StatusBadRequest, "body: %s", display.OneLine(err.Error(), 200))
	}
	return false
}

// decodeOptionalBody is decodeBody for a body that may be absent.
func decodeOptionalBody(w http.ResponseWriter, r *http.Request, v any) bool {
	if r.ContentLength == 0 {
		return true
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxSmallBody))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "body: larger than %d bytes", MaxSmallBody)
		return false
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return true
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	return decodeBody(w, r, MaxSmallBody, v, true)
}

// jsonKind names a Go kind the way a JSON user knows it.
func jsonKind(kind string) string {
	switch {
	case strings.HasPrefix(kind, "int"), strings.HasPrefix(kind, "uint"), strings.HasPrefix(kind, "float"):
		return "number"
	case kind == "slice" || kind == "array":
		return "array"
	case kind == "map" || kind == "struct" || kind == "ptr":
		return "object"
	case kind == "bool":
		return "boolean"
	}
	return kind
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"the app could not encode its answer"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, ErrorResponse{Error: fmt.Sprintf(format, args...)})
}
