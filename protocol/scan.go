package protocol

import (
	"bytes"
	"encoding/json"
	"strings"
)

// Decode used to unmarshal every frame into a map first, to learn its type and which keys
// are present, and then again into the typed struct: four passes of encoding/json's scanner
// over a 64 KiB output record. scanTop replaces the map with one cheap pass that validates the
// frame by encoding/json's own grammar and keeps only the top-level keys Decode reads.

// maxNestingDepth is encoding/json's limit: a frame nested deeper is not JSON to it, so it
// must not be to scanTop either.
const maxNestingDepth = 10000

// knownKeys are the top-level keys Decode reads before choosing a Go type: "type", the keys
// an error's ref comes from, and every required key.
var knownKeys = func() map[string]bool {
	k := map[string]bool{"type": true, "job": true, "id": true, "hash": true}
	for _, s := range spec {
		for _, r := range s.required {
			k[r] = true
		}
	}
	return k
}()

// topField is the last value given for a known key, as exact bytes, and how often it came.
type topField struct {
	key   string
	value []byte
	count int
}

// topFields is what scanTop learnt about a frame's top-level object.
type topFields struct {
	fields []topField
	// folded is set when some key differs from a known key only in case (or by Unicode
	// folding): encoding/json fills a field from such a key too, so only it may decode then.
	folded bool
}

func (t *topFields) get(key string) ([]byte, bool) {
	for _, f := range t.fields {
		if f.key == key {
			return f.value, true
		}
	}
	return nil, false
}

func (t *topFields) add(rawKey, value []byte) {
	key := plainKey(rawKey)
	for i := range t.fields {
		if t.fields[i].key == key {
			t.fields[i].value = value
			t.fields[i].count++
			return
		}
	}
	if knownKeys[key] {
		t.fields = append(t.fields, topField{key: key, value: value, count: 1})
		return
	}
	if !t.folded {
		t.folded = foldsToKnown(key)
	}
}

// foldsToKnown reports whether key equals a known key under Unicode case folding, as
// encoding/json matches keys to fields.
func foldsToKnown(key string) bool {
	var lower [32]byte
	if len(key) <= len(lower) {
		ascii := true
		for i := 0; i < len(key) && ascii; i++ {
			c := key[i]
			ascii = c < 0x80
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			lower[i] = c
		}
		if ascii {
			// An ASCII key folds to an ASCII key only by ASCII case; known keys are lower case.
			return knownKeys[string(lower[:len(key)])]
		}
	}
	for k := range knownKeys {
		if strings.EqualFold(key, k) {
			return true
		}
	}
	return false
}

// plainKey turns a quoted key into the string encoding/json would make of it.
func plainKey(raw []byte) string {
	inner := raw[1 : len(raw)-1]
	for _, c := range inner {
		if c == '\\' || c >= 0x80 {
			// Escapes, and invalid UTF-8 (which becomes U+FFFD), are rare: let encoding/json
			// unquote exactly as it does for map keys.
			var s string
			_ = json.Unmarshal(raw, &s) // raw is a string scanTop already checked
			return s
		}
	}
	return string(inner)
}

// ref picks the job or request id out of a message so an error can point at it.
func (t *topFields) ref() string {
	for _, k := range []string{"job", "id", "hash"} {
		var s string
		if raw, ok := t.get(k); ok && json.Unmarshal(raw, &s) == nil {
			return clip(s, 128)
		}
	}
	return ""
}

// scanTop reports whether data is a single JSON object exactly as encoding/json judges it
// (RFC 8259 grammar, no UTF-8 check inside strings, nesting up to 10000), and collects its
// known top-level keys.
func scanTop(data []byte) (topFields, bool) {
	top, ok, _ := scanTopDepth(data)
	return top, ok
}

// scanTopDepth is scanTop that also reports whether the frame failed for being nested deeper
// than maxNestingDepth, so the sender hears that rather than "not a JSON object".
func scanTopDepth(data []byte) (top topFields, ok, tooDeep bool) {
	s := jsonScanner{data: data}
	s.space()
	if s.peek() != '{' {
		return top, false, false
	}
	if !s.object(&top) {
		return top, false, s.tooDeep
	}
	s.space()
	return top, s.pos == len(data), false
}

type jsonScanner struct {
	data    []byte
	pos     int
	depth   int
	tooDeep bool // set once depth passed maxNestingDepth
}

// peek returns the next byte, or 0 at the end; 0 starts no JSON token.
func (s *jsonScanner) peek() byte {
	if s.pos < len(s.data) {
		return s.data[s.pos]
	}
	return 0
}

func (s *jsonScanner) space() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

func (s *jsonScanner) value() bool {
	switch c := s.peek(); {
	case c == '{':
		return s.object(nil)
	case c == '[':
		return s.array()
	case c == '"':
		return s.string()
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	}
	return false
}

// object scans an object; with top set, it records the object's members there.
func (s *jsonScanner) object(top *topFields) bool {
	if s.depth++; s.depth > maxNestingDepth {
		s.tooDeep = true
		return false
	}
	s.pos++ // {
	s.space()
	if s.peek() == '}' {
		s.pos++
		s.depth--
		return true
	}
	for {
		if s.peek() != '"' {
			return false
		}
		keyStart := s.pos
		if !s.string() {
			return false
		}
		keyEnd := s.pos
		s.space()
		if s.peek() != ':' {
			return false
		}
		s.pos++
		s.space()
		valueStart := s.pos
		if !s.value() {
			return false
		}
		if top != nil {
			top.add(s.data[keyStart:keyEnd], s.data[valueStart:s.pos])
		}
		s.space()
		switch s.peek() {
		case ',':
			s.pos++
			s.space()
		case '}':
			s.pos++
			s.depth--
			return true
		default:
			return false
		}
	}
}

func (s *jsonScanner) array() bool {
	if s.depth++; s.depth > maxNestingDepth {
		s.tooDeep = true
		return false
	}
	s.pos++ // [
	s.space()
	if s.peek() == ']' {
		s.pos++
		s.depth--
		return true
	}
	for {
		if !s.value() {
			return false
		}
		s.space()
		switch s.peek() {
		case ',':
			s.pos++
			s.space()
		case ']':
			s.pos++
			s.depth--
			return true
		default:
			return false
		}
	}
}

// plainStringByte marks the bytes that stand for themselves inside a JSON string: not the
// quote, not the backslash, not a control character. Bytes of 0x80 and up pass, as they do
// for encoding/json, which does not check UTF-8 here.
var plainStringByte = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func (s *jsonScanner) string() bool {
	d, i := s.data, s.pos+1
	for i < len(d) {
		// The long run of plain bytes is where a 64 KiB output record spends its time.
		for i < len(d) && plainStringByte[d[i]] {
			i++
		}
		if i >= len(d) {
			return false
		}
		switch d[i] {
		case '"':
			s.pos = i + 1
			return true
		case '\\':
			if i+1 >= len(d) {
				return false
			}
			switch d[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(d) {
					return false
				}
				for _, h := range d[i+2 : i+6] {
					if !isHexDigit(h) {
						return false
					}
				}
				i += 6
			default:
				return false
			}
		default: // a control character
			return false
		}
	}
	return false
}

func (s *jsonScanner) number() bool {
	d, i := s.data, s.pos
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && d[i] >= '1' && d[i] <= '9':
		i = digits(d, i)
	default:
		return false
	}
	if i < len(d) && d[i] == '.' {
		if i++; i >= len(d) || !isDigit(d[i]) {
			return false
		}
		i = digits(d, i)
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) || !isDigit(d[i]) {
			return false
		}
		i = digits(d, i)
	}
	s.pos = i
	return true
}

func (s *jsonScanner) literal(word string) bool {
	if !bytes.HasPrefix(s.data[s.pos:], []byte(word)) {
		return false
	}
	s.pos += len(word)
	return true
}

func digits(d []byte, i int) int {
	for i < len(d) && isDigit(d[i]) {
		i++
	}
	return i
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isHexDigit(c byte) bool {
	return isDigit(c) || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// decodeRecord fills a Record straight from the values scanTop found, when that gives what
// json.Unmarshal of the whole frame would: every field came once, under its exact name, and
// no other key folds onto a field name. Otherwise, or when a value does not fit its field,
// it reports false and Decode unmarshals the whole frame, which also words the error.
// Records are the one message that is both frequent and large, which is why they get this.
func decodeRecord(top *topFields) (*Record, bool) {
	if top.folded {
		return nil, false
	}
	r := &Record{}
	for _, f := range top.fields {
		var err error
		switch f.key {
		case "job":
			err = json.Unmarshal(f.value, &r.Job)
		case "seq":
			err = json.Unmarshal(f.value, &r.Seq)
		case "kind":
			err = json.Unmarshal(f.value, &r.Kind)
		case "at":
			err = json.Unmarshal(f.value, &r.At)
		case "data":
			// What json.RawMessage's UnmarshalJSON does: copy the value's exact bytes.
			r.Data = append(json.RawMessage(nil), f.value...)
		default:
			continue // not a Record field: json.Unmarshal ignores it too
		}
		if err != nil || f.count > 1 {
			return nil, false
		}
	}
	return r, true
}
