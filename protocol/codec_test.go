package protocol

import (
	"errors"
	"testing"
)

func TestDecodeRefusals(t *testing.T) {
	for _, tc := range []struct {
		name, in, code, ref string
	}{
		{"not json", `nope`, ErrBadJSON, ""},
		{"array", `[1]`, ErrBadJSON, ""},
		{"no type", `{"job":"j1"}`, ErrMissingField, "j1"},
		{"type not string", `{"type":1}`, ErrBadField, ""},
		{"unknown type", `{"type":"job.explode","job":"j2"}`, ErrUnknownType, "j2"},
		{"missing field", `{"type":"ack","job":"j3"}`, ErrMissingField, "j3"},
		{"null field", `{"type":"ack","job":"j3","seq":null}`, ErrMissingField, "j3"},
		{"wrong type", `{"type":"ack","job":"j4","seq":"7"}`, ErrBadField, "j4"},
		{"bad job id", `{"type":"job.cancel","job":"../etc"}`, ErrInvalid, "../etc"},
		{"seq zero", `{"type":"record","job":"j","seq":0,"kind":"output","at":"2026-12-02T10:00:00Z","data":{}}`, ErrInvalid, "j"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.in))
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("Decode(%s) = %v, want a *DecodeError", tc.in, err)
			}
			if de.Code != tc.code || de.Ref != tc.ref {
				t.Fatalf("Decode(%s): code %q ref %q, want code %q ref %q (%s)", tc.in, de.Code, de.Ref, tc.code, tc.ref, de.Message)
			}
		})
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	in := &Hello{Protocol: 1, Name: "rte01", Version: "1.0.0", Mode: ModeInbound, Files: FilesTransfer, MaxJobs: 10,
		Spooled: []SpooledJob{{Job: "j1", LastSeq: 42}}}
	b, err := Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Decode(b)
	if err != nil {
		t.Fatalf("Decode(%s): %v", b, err)
	}
	h, ok := m.(*Hello)
	if !ok || h.Name != "rte01" || h.Spooled[0].LastSeq != 42 {
		t.Fatalf("round trip gave %#v", m)
	}
	b, _ = Encode(Approved{})
	if string(b) != `{"type":"approved"}` {
		t.Fatalf("Encode(Approved{}) = %s", b)
	}
}

func TestSealedSecret(t *testing.T) {
	s, err := SealSecret("0123456789abcdef", "1042", "hunter2")
	if err != nil {
		t.Fatal(err)
	}
	got, err := OpenSecret("0123456789abcdef", "1042", s)
	if err != nil || got != "hunter2" {
		t.Fatalf("OpenSecret = %q, %v", got, err)
	}
	if _, err := OpenSecret("0123456789abcdef", "1043", s); !errors.Is(err, ErrSecretOpen) {
		t.Fatalf("another job id opened the secret: %v", err)
	}
}

func TestShortFingerprint(t *testing.T) {
	// sha256("abc") = ba7816bf...
	if got := ShortFingerprint([]byte("abc")); got != "ba78-16bf" {
		t.Fatalf("ShortFingerprint(abc) = %s, want ba78-16bf", got)
	}
}
