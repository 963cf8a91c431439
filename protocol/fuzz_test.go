package protocol_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rte-project/rte/protocol"
)

// trickyFrames are inputs where a JSON decoder written by hand could part ways with
// encoding/json: escapes in keys, keys that differ only in case, repeated keys, odd numbers,
// odd whitespace, nesting at the limit.
func trickyFrames() []string {
	const rec = `"job":"j","seq":1,"kind":"output","at":"2026-12-02T10:00:00Z","data":{"text":"x"}`
	deep := func(n int) string {
		return `{"type":"ack","job":"j","seq":1,"x":` + strings.Repeat("[", n-1) + strings.Repeat("]", n-1) + `}`
	}
	return []string{
		`{"type":"record",` + rec + `}`,
		`{"type":"record",` + rec + `,"SEQ":2}`,
		`{"type":"record",` + rec + `,"ſeq":2}`,
		`{"type":"record",` + rec + `,"seq":3}`,
		`{"type":"record",` + rec + `,"Data":"x"}`,
		`{"type":"record",` + rec + `,"at":null}`,
		`{"type":"record","job":"j","seq":1,"kind":"output","at":"2026-12-02T10:00:00+02:30","data":{}}`,
		`{"type":"record","job":"j","seq":1.0,"kind":"output","at":"2026-12-02T10:00:00Z","data":{}}`,
		`{"type":"record","job":"j","seq":1,"kind":"output","at":"2026-12-02 10:00:00Z","data":{}}`,
		`{"type":"record","job":"j","seq":1,"kind":"output","at":"2026-12-02T10:00:00Z","data":[]}`,
		`{"type":"record","job":"j","seq":1,"kind":"output","at":"2026-12-02T10:00:00Z","data":{"text":"\ud800\u00e9<&>\u2028"}}`,
		`{"type":"record","job":7,"seq":"1","kind":"output","at":"2026-12-02T10:00:00Z","data":{}}`,
		"{\"type\":\"record\",\"job\":\"j\",\"seq\":1,\"kind\":\"output\",\"at\":\"2026-12-02T10:00:00Z\",\"data\":{\"text\":\"\xff\xfe\"}}",
		`{"t\u0079pe":"ack","j\u006fb":"x","seq":1}`,
		`{"TYPE":"ack","job":"j","seq":1}`,
		`{"type":"ack","Job":"../x","job":"j","seq":1}`,
		`{"type":"ack","job":"j","seq":1,"type":"hello"}`,
		`{"type":null,"job":"j"}`,
		`{"type":"ack","job":null,"id":"i","seq":1}`,
		`{"type":"ack","job":1,"id":"i","seq":1}`,
		` {"type":"ack","job":"j","seq":1} `,
		"\t\r\n{\"type\":\"ack\",\"job\":\"j\",\"seq\":1}\n",
		`{"type":"ack","job":"j","seq":1}x`,
		`{"type":"ack","job":"j","seq":1}{}`,
		`{"type":"ack","job":"j","seq":1,}`,
		`{"type":"ack","job":"j","seq":-0}`,
		`{"type":"ack","job":"j","seq":01}`,
		`{"type":"ack","job":"j","seq":1e2}`,
		`{"type":"ack","job":"j","seq":1E+2}`,
		`{"type":"ack","job":"j","seq":1.}`,
		`{"type":"ack","job":"j","seq":-}`,
		`{"type":"ack","job":"j","seq":99999999999999999999}`,
		`{"type":"ack","job":"j","seq":1,"x":[1,2,{"a":[true,false,null]}]}`,
		`{"type":"ack","job":"j","seq":1,"x":tru}`,
		`{"type":"ack","job":"j","seq":1,"x":nulll}`,
		`{"type":"ack","job":"j","seq":1,"x":"\x"}`,
		`{"type":"ack","job":"j","seq":1,"x":"\u12"}`,
		"{\"type\":\"ack\",\"job\":\"j\",\"seq\":1,\"x\":\"a\x01b\"}",
		`{"type":"ack","job":"j","seq":1,"x":"\/\b\f\n\r\t\"\\"}`,
		deep(10000),
		deep(10001),
		`{}`, `[]`, `null`, `"ack"`, `7`, ``, ` `, `{`, `{"type"}`, `{"type":}`, `{"type" "ack"}`,
		`{"type":"hello","protocol":1,"name":"r","version":"1","mode":"inbound","files":"local","max_jobs":0,"running":[],"spooled":null}`,
		`{"type":"job.start","job":"j","playbook":"p","extravars":null,"tags":[],"env":{}}`,
		`{"type":"job.start","job":"j","playbook":"p","extravars":{ "a" : [ 1 , 2 ] }}`,
		`{"type":"welcome","protocol":1,"node":"n","approved":true,"acked":{}}`,
		`{"type":"error","code":"x","message":"m","ref":""}`,
		`{"type":"bundle.frames","hash":"sha256:2d09cc910dd77738e3e9a12b5d2baea13723f3ffaf32dde9dc70a050755048ba","size":3,"frames":[{"size":1,"sha256":"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"},{"size":9223372036854775807,"sha256":"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}]}`,
		`{"type":"bundle.ranges","job":"j","hash":"sha256:2d09cc910dd77738e3e9a12b5d2baea13723f3ffaf32dde9dc70a050755048ba","ranges":[{"offset":9223372036854775806,"size":2}]}`,
		`{"type":"bundle.want","job":"j","hashes":[],"frames":null}`,
		`{"type":"welcome","protocol":1,"node":"n","approved":true,"features":[]}`,
	}
}

// TestDecodeMatchesReference holds Decode's single-pass scan to the plain map-first decoder
// on inputs chosen to tell them apart.
func TestDecodeMatchesReference(t *testing.T) {
	for _, in := range trickyFrames() {
		checkSameAsReference(t, []byte(in))
	}
}

func checkSameAsReference(t *testing.T, data []byte) {
	t.Helper()
	got, err := protocol.Decode(data)
	want, wantErr := protocol.DecodeReference(data)
	show := string(data)
	if len(show) > 200 {
		show = show[:200] + "..."
	}
	if (err == nil) != (wantErr == nil) {
		t.Fatalf("Decode(%q) = %v, %v; the reference decoder gives %v, %v", show, got, err, want, wantErr)
	}
	if err != nil {
		var de, wantDE *protocol.DecodeError
		if !errors.As(err, &de) || !errors.As(wantErr, &wantDE) {
			t.Fatalf("Decode(%q): error %T, want a *DecodeError", show, err)
		}
		if *de != *wantDE {
			t.Fatalf("Decode(%q) refused with %+v; the reference decoder with %+v", show, *de, *wantDE)
		}
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Decode(%q) = %#v; the reference decoder gives %#v", show, got, want)
	}
}

// FuzzDecode checks that Decode never panics, that it agrees exactly with the reference
// decoder, and that whatever it accepts survives Encode and Decode again unchanged.
func FuzzDecode(f *testing.F) {
	for _, ex := range exampleFrames(f) {
		f.Add(ex)
	}
	for _, in := range trickyFrames() {
		if len(in) < 1000 {
			f.Add([]byte(in))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkSameAsReference(t, data)
		m, err := protocol.Decode(data)
		if err != nil {
			return
		}
		frame, err := protocol.Encode(m)
		if err != nil {
			t.Fatalf("Encode of an accepted %s (from %q): %v", m.Type(), data, err)
		}
		again, err := protocol.Decode(frame)
		if err != nil {
			t.Fatalf("Decode refused what Encode made of an accepted %s: %v\nfirst:  %q\nencoded: %s", m.Type(), err, data, frame)
		}
		if !sameValue(reflect.ValueOf(m), reflect.ValueOf(again)) {
			t.Fatalf("round trip changed the %s\nfirst:  %#v\nsecond: %#v\nencoded: %s", m.Type(), m, again, frame)
		}
	})
}

var (
	timeType = reflect.TypeFor[time.Time]()
	rawType  = reflect.TypeFor[json.RawMessage]()
)

// sameValue is equality as the protocol means it: times are the same instant, raw JSON is the
// same JSON (Encode compacts it and escapes <, > and &), and an empty list or map is the same
// as an absent one (omitempty drops both).
func sameValue(a, b reflect.Value) bool {
	switch a.Type() {
	case timeType:
		return a.Interface().(time.Time).Equal(b.Interface().(time.Time))
	case rawType:
		return sameJSON(a.Bytes(), b.Bytes())
	}
	switch a.Kind() {
	case reflect.Pointer, reflect.Interface:
		if a.IsNil() || b.IsNil() {
			return a.IsNil() == b.IsNil()
		}
		return sameValue(a.Elem(), b.Elem())
	case reflect.Struct:
		for i := range a.NumField() {
			if !sameValue(a.Field(i), b.Field(i)) {
				return false
			}
		}
		return true
	case reflect.Slice:
		if a.Len() != b.Len() {
			return false
		}
		for i := range a.Len() {
			if !sameValue(a.Index(i), b.Index(i)) {
				return false
			}
		}
		return true
	case reflect.Map:
		if a.Len() != b.Len() {
			return false
		}
		for it := a.MapRange(); it.Next(); {
			bv := b.MapIndex(it.Key())
			if !bv.IsValid() || !sameValue(it.Value(), bv) {
				return false
			}
		}
		return true
	default:
		return a.Equal(b)
	}
}

func sameJSON(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var va, vb any
	if decodeNumbers(a, &va) != nil || decodeNumbers(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

// decodeNumbers keeps numbers as their text, so that 1e400 or a 20-digit integer compare
// without float rounding.
func decodeNumbers(b []byte, v *any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	return dec.Decode(v)
}

func TestDecodeChunkRefusals(t *testing.T) {
	var hash [32]byte
	header := append([]byte{protocol.ChunkTag}, make([]byte, 40)...)
	for _, tc := range []struct {
		name  string
		frame []byte
		ok    bool
	}{
		{"empty", nil, false},
		{"one byte short of a header", header[:40], false},
		{"header only", header, true},
		{"wrong tag", append([]byte{0x02}, header[1:]...), false},
		{"largest payload", append(bytes.Clone(header), make([]byte, protocol.MaxChunkPayload)...), true},
		{"payload one byte over", append(bytes.Clone(header), make([]byte, protocol.MaxChunkPayload+1)...), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := protocol.DecodeChunk(tc.frame)
			if (err == nil) != tc.ok {
				t.Fatalf("DecodeChunk(%d bytes) error = %v, want ok=%v", len(tc.frame), err, tc.ok)
			}
		})
	}
	if _, err := protocol.EncodeChunk(hash, 0, make([]byte, protocol.MaxChunkPayload+1)); err == nil {
		t.Fatalf("EncodeChunk took a payload over %d bytes", protocol.MaxChunkPayload)
	}
}

// FuzzDecodeChunk checks that DecodeChunk never panics, refuses only malformed frames, and
// that a frame it accepts re-encodes to the same bytes.
func FuzzDecodeChunk(f *testing.F) {
	var hash [32]byte
	copy(hash[:], "0123456789abcdef0123456789abcdef")
	for _, p := range [][]byte{nil, []byte("zstd"), bytes.Repeat([]byte{0xff}, 300)} {
		frame, err := protocol.EncodeChunk(hash, 1<<20, p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(frame)
	}
	f.Add([]byte{})
	f.Add([]byte{protocol.ChunkTag})
	f.Add([]byte{0x02, 1, 2, 3})
	f.Fuzz(func(t *testing.T, frame []byte) {
		c, err := protocol.DecodeChunk(frame)
		wellFormed := len(frame) >= 41 && frame[0] == protocol.ChunkTag && len(frame)-41 <= protocol.MaxChunkPayload
		if err != nil {
			if wellFormed {
				t.Fatalf("DecodeChunk refused a well-formed %d-byte frame: %v", len(frame), err)
			}
			return
		}
		if !wellFormed {
			t.Fatalf("DecodeChunk accepted a malformed %d-byte frame %x", len(frame), frame)
		}
		again, err := protocol.EncodeChunk(c.Hash, c.Offset, c.Payload)
		if err != nil || !bytes.Equal(again, frame) {
			t.Fatalf("EncodeChunk(DecodeChunk(%x)) = %x, %v", frame, again, err)
		}
		if h, err := protocol.ParseHash(c.HashName()); err != nil || h != c.Hash {
			t.Fatalf("ParseHash(%s) = %x, %v; want %x", c.HashName(), h, err, c.Hash)
		}
	})
}
