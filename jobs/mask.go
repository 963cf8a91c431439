package jobs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"
)

// maskText replaces every secret value in output and events.
const maskText = "********"

// secretSet is what to mask for a job's secret values: each value as it is and as ansible
// reads it from a password file (whitespace stripped), and each of those as JSON escapes it,
// the way Python does (ensure_ascii or not) and the way Go does. All forms are longest first:
// at one position the longest form wins, so a secret that contains another is masked whole.
type secretSet struct {
	output [][]byte // every form
	// events holds only the escaped forms: an event is JSON, and a raw form that differs from
	// its escaped one could only match across JSON syntax.
	events [][]byte
	plain  []string // the values themselves, to mask decoded JSON strings
}

func newSecretSet(values []string) *secretSet {
	s := &secretSet{}
	seenOut, seenEv, seenPlain := map[string]bool{}, map[string]bool{}, map[string]bool{}
	add := func(list [][]byte, seen map[string]bool, v string) [][]byte {
		if v == "" || seen[v] {
			return list
		}
		seen[v] = true
		return append(list, []byte(v))
	}
	for _, v := range values {
		for _, p := range []string{v, strings.TrimSpace(v)} {
			if p != "" && !seenPlain[p] {
				seenPlain[p] = true
				s.plain = append(s.plain, p)
			}
			s.output = add(s.output, seenOut, p)
			for _, esc := range jsonEscapes(p) {
				s.output = add(s.output, seenOut, esc)
				s.events = add(s.events, seenEv, esc)
			}
		}
	}
	for _, l := range [][][]byte{s.output, s.events} {
		sort.SliceStable(l, func(i, j int) bool { return len(l[i]) > len(l[j]) })
	}
	sort.SliceStable(s.plain, func(i, j int) bool { return len(s.plain[i]) > len(s.plain[j]) })
	return s
}

// jsonEscapes returns s escaped inside a JSON string as Python's json.dumps writes it (the
// default ensure_ascii=True and ensure_ascii=False) and as Go's encoding/json does.
func jsonEscapes(s string) []string {
	var out []string
	out = append(out, pyEscape(s, true), pyEscape(s, false))
	if b, err := json.Marshal(s); err == nil {
		out = append(out, string(b[1:len(b)-1]))
	}
	return out
}

// pyEscape escapes s like Python's json.dumps (without the quotes).
func pyEscape(s string, ensureASCII bool) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20:
			fmt.Fprintf(&b, `\u%04x`, r)
		case ensureASCII && r > 0x7e && r < 0x10000:
			fmt.Fprintf(&b, `\u%04x`, r)
		case ensureASCII && r >= 0x10000:
			r -= 0x10000
			fmt.Fprintf(&b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// masker replaces secret forms in a byte stream that arrives in pieces. A secret may be split
// across two pieces, so the masker holds back the end of a piece when it could be the start
// of a secret (at most the longest form minus one byte), and decides when more arrives.
type masker struct {
	forms [][]byte // longest first
	held  []byte
	next  []int // scratch for replaceAll
}

func newMasker(forms [][]byte) *masker {
	return &masker{forms: forms, next: make([]int, len(forms))}
}

// write appends to dst the masked bytes of what was held and p that can no longer be part of a
// secret, and holds the rest.
func (m *masker) write(dst, p []byte) []byte {
	if len(m.forms) == 0 {
		return append(dst, p...)
	}
	buf := p
	if len(m.held) > 0 {
		m.held = append(m.held, p...)
		buf = m.held
	}
	// From hold on, buf may be the start of a secret that the next piece completes. A match
	// there is not taken yet either: a longer secret may start at the same place, and the
	// leftmost longest match must win however the stream is split.
	hold := len(buf) - partialSuffix(buf, m.forms)
	dst, rest := replaceAll(dst, buf, m.forms, m.next, hold)
	if rest < hold {
		dst = append(dst, buf[rest:hold]...)
		rest = hold
	}
	// append copies with memmove semantics, so buf[rest:] may overlap m.held.
	m.held = append(m.held[:0], buf[rest:]...)
	return dst
}

// flush appends what is held, masked: at the end of the stream nothing more can complete it.
func (m *masker) flush(dst []byte) []byte {
	dst, rest := replaceAll(dst, m.held, m.forms, m.next, len(m.held))
	dst = append(dst, m.held[rest:]...)
	m.held = m.held[:0]
	return dst
}

// drop forgets what is held, when the stream is cut: those bytes may be a secret's start.
func (m *masker) drop() { m.held = m.held[:0] }

// replaceAll appends buf to dst with every occurrence of a form that starts before limit
// replaced, leftmost first and the longest at a position, stopping at the first occurrence at
// or after limit. It returns the index in buf up to which it appended. next is scratch of
// len(forms).
func replaceAll(dst, buf []byte, forms [][]byte, next []int, limit int) ([]byte, int) {
	for i, f := range forms {
		next[i] = bytes.Index(buf, f)
	}
	start := 0
	for {
		best := -1
		for i, at := range next {
			if at >= 0 && (best < 0 || at < next[best]) {
				best = i
			}
		}
		if best < 0 || next[best] >= limit {
			return dst, start
		}
		at := next[best]
		dst = append(dst, buf[start:at]...)
		dst = append(dst, maskText...)
		start = at + len(forms[best])
		for i, f := range forms {
			if next[i] >= 0 && next[i] < start {
				if j := bytes.Index(buf[start:], f); j >= 0 {
					next[i] = start + j
				} else {
					next[i] = -1
				}
			}
		}
	}
}

// partialSuffix returns the length of the longest end of b that is a proper prefix of a form.
func partialSuffix(b []byte, forms [][]byte) int {
	keep := 0
	for _, f := range forms {
		// A candidate starts in the last len(f)-1 bytes and must be longer than keep; the
		// earliest that matches is the longest.
		for i := len(b) - min(len(f)-1, len(b)); i < len(b)-keep; i++ {
			j := bytes.IndexByte(b[i:len(b)-keep], f[0])
			if j < 0 {
				break
			}
			i += j
			if bytes.HasPrefix(f, b[i:]) {
				keep = len(b) - i
				break
			}
		}
	}
	return keep
}

// maskEvent masks a whole event line, appending to dst, and reports whether the result is
// JSON. When a match lands outside a JSON string (a secret that looks like a number, say) the
// fast replacement breaks the JSON, so the event is decoded, masked string by string with the
// plain values, and encoded again.
func maskEvent(dst, line []byte, s *secretSet, next []int) ([]byte, bool) {
	start := len(dst)
	dst, rest := replaceAll(dst, line, s.events, next, len(line))
	if rest == 0 {
		return append(dst, line...), json.Valid(line)
	}
	dst = append(dst, line[rest:]...)
	if json.Valid(dst[start:]) {
		return dst, true
	}
	dst = dst[:start]
	var v any
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return dst, false
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(maskValue(v, s.plain)); err != nil {
		return dst, false
	}
	return append(dst, bytes.TrimRight(buf.Bytes(), "\n")...), true
}

// maskValue masks every string (keys included) of a decoded JSON value.
func maskValue(v any, forms []string) any {
	switch t := v.(type) {
	case string:
		return maskString(t, forms)
	case []any:
		for i := range t {
			t[i] = maskValue(t[i], forms)
		}
		return t
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[maskString(k, forms)] = maskValue(e, forms)
		}
		return out
	}
	return v
}

func maskString(s string, forms []string) string {
	for _, f := range forms {
		s = strings.ReplaceAll(s, f, maskText)
	}
	return s
}

// validUTF8 turns a byte stream into valid UTF-8 without splitting a rune between two calls:
// an incomplete rune at the end of a piece waits for the next, and invalid bytes become U+FFFD.
type validUTF8 struct {
	carry []byte
}

const replacementChar = "\uFFFD"

func (u *validUTF8) write(dst, p []byte) []byte {
	if len(u.carry) > 0 {
		n := len(u.carry)
		u.carry = append(u.carry, p[:min(len(p), utf8.UTFMax)]...)
		i := 0
		for i < n {
			if !utf8.FullRune(u.carry[i:]) {
				// Still incomplete, so all of p (at most 3 bytes) is in carry.
				u.carry = append(u.carry[:0], u.carry[i:]...)
				return dst
			}
			r, size := utf8.DecodeRune(u.carry[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, replacementChar...)
			} else {
				dst = append(dst, u.carry[i:i+size]...)
			}
			i += size
		}
		p = p[i-n:]
		u.carry = u.carry[:0]
	}
	end := len(p) - incompleteSuffix(p)
	if utf8.Valid(p[:end]) {
		dst = append(dst, p[:end]...)
	} else {
		dst = appendValid(dst, p[:end])
	}
	u.carry = append(u.carry, p[end:]...)
	return dst
}

// flush ends the stream: an incomplete rune becomes U+FFFD.
func (u *validUTF8) flush(dst []byte) []byte {
	if len(u.carry) > 0 {
		dst = appendValid(dst, u.carry)
		u.carry = u.carry[:0]
	}
	return dst
}

// incompleteSuffix returns how many bytes at the end of p start a rune that p does not finish.
func incompleteSuffix(p []byte) int {
	for j := 1; j <= min(utf8.UTFMax-1, len(p)); j++ {
		b := p[len(p)-j]
		if b < utf8.RuneSelf {
			return 0
		}
		if utf8RuneStart(b) {
			if !utf8.FullRune(p[len(p)-j:]) {
				return j
			}
			return 0
		}
	}
	return 0
}

// appendValid appends p with each invalid byte replaced by U+FFFD.
func appendValid(dst, p []byte) []byte {
	for len(p) > 0 {
		r, size := utf8.DecodeRune(p)
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, replacementChar...)
		} else {
			dst = append(dst, p[:size]...)
		}
		p = p[size:]
	}
	return dst
}
