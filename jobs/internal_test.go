package jobs

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// pipeline runs text through the output stages (masker, then valid UTF-8) in the given pieces,
// as the job's goroutine does, and returns what would be batched.
func pipeline(s *secretSet, pieces [][]byte) string {
	m := newMasker(s.output)
	var u validUTF8
	var out []byte
	for _, p := range pieces {
		out = u.write(out, m.write(nil, p))
	}
	out = u.write(out, m.flush(nil))
	return string(u.flush(out))
}

func TestMaskerFindsSecretsSplitAtAnyByte(t *testing.T) {
	s := newSecretSet([]string{"hunter2", "hunter2-and-more", " padded \n", `q"uote`})
	text := []byte(`a hunter2 b hunter2-and-more c hunthunter2 d padded e hunter q\"uote f q"uote` + "\n")
	want := `a ******** b ******** c hunt******** d ******** e hunter ******** f ********` + "\n"
	if got := pipeline(s, [][]byte{text}); got != want {
		t.Fatalf("whole text:\n got %q\nwant %q", got, want)
	}
	for i := 0; i <= len(text); i++ {
		for j := i; j <= len(text); j += 3 {
			if got := pipeline(s, [][]byte{text[:i], text[i:j], text[j:]}); got != want {
				t.Fatalf("split at %d and %d:\n got %q\nwant %q", i, j, got, want)
			}
		}
	}
}

func TestMaskerHoldsOnlyAPossibleSecretStart(t *testing.T) {
	m := newMasker(newSecretSet([]string{"password123"}).output)
	if got := string(m.write(nil, []byte("ok pass"))); got != "ok " {
		t.Errorf("write(%q) emitted %q, want %q (the rest may start the secret)", "ok pass", got, "ok ")
	}
	if got := string(m.write(nil, []byte("ive"))); got != "passive" {
		t.Errorf("write(%q) emitted %q, want %q once it cannot be the secret", "ive", got, "passive")
	}
	m.write(nil, []byte("x passw"))
	m.drop()
	if got := string(m.flush(nil)); got != "" {
		t.Errorf("flush after drop = %q, want nothing", got)
	}
}

func TestSecretSetHasJSONForms(t *testing.T) {
	s := newSecretSet([]string{"Ü\"\t<x>\U0001F600"})
	for _, want := range []string{
		"Ü\"\t<x>\U0001F600",                // raw
		`Ü\"\t<x>` + "\U0001F600",           // Python ensure_ascii=False
		`\u00dc\"\t<x>\ud83d\ude00`,         // Python's default
		`Ü\"\t\u003cx\u003e` + "\U0001F600", // Go's encoding/json
	} {
		if !slices.ContainsFunc(s.output, func(f []byte) bool { return string(f) == want }) {
			t.Errorf("output forms lack %q; have %q", want, s.output)
		}
	}
	if slices.ContainsFunc(s.events, func(f []byte) bool { return string(f) == "Ü\"\t<x>\U0001F600" }) {
		t.Errorf("event forms hold the raw value, which can only match across JSON syntax")
	}
	for i := 1; i < len(s.output); i++ {
		if len(s.output[i]) > len(s.output[i-1]) {
			t.Errorf("forms are not longest first: %q", s.output)
		}
	}
}

func TestMaskEventKeepsJSONValid(t *testing.T) {
	s := newSecretSet([]string{"12", `a"b`})
	next := make([]int, len(s.events))
	tests := []struct{ in, want string }{
		{`{"msg":"x12y"}`, `{"msg":"x********y"}`},
		{`{"msg":"a\"b"}`, `{"msg":"********"}`},
		// 12 also matches the number: the fast path breaks the JSON, the slow path masks
		// strings only.
		{`{"counter":12,"msg":"x12y"}`, `{"counter":12,"msg":"x********y"}`},
		{`{"k12":[1,"12"]}`, `{"k********":[1,"********"]}`},
	}
	for _, tt := range tests {
		got, ok := maskEvent(nil, []byte(tt.in), s, next)
		if !ok || !json.Valid(got) {
			t.Errorf("maskEvent(%s) = %s, %v; want valid JSON", tt.in, got, ok)
			continue
		}
		var g, w any
		json.Unmarshal(got, &g)
		json.Unmarshal([]byte(tt.want), &w)
		if gb, _ := json.Marshal(g); string(gb) != mustJSON(w) {
			t.Errorf("maskEvent(%s) = %s, want %s", tt.in, got, tt.want)
		}
	}
	if _, ok := maskEvent(nil, []byte(`{"not json`), s, next); ok {
		t.Errorf("maskEvent of broken JSON reported ok")
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestValidUTF8NeverSplitsARune(t *testing.T) {
	text := []byte("aé€😀\xff\xe2\x82x\xf0\x9f\x98" + "b")
	want := "aé€😀\uFFFD\uFFFD\uFFFDx\uFFFD\uFFFD\uFFFDb"
	whole := string(appendValid(nil, text))
	if whole != want {
		t.Fatalf("appendValid = %q, want %q", whole, want)
	}
	for i := 0; i <= len(text); i++ {
		var u validUTF8
		first := u.write(nil, text[:i])
		if !utf8.Valid(first) {
			t.Errorf("split at %d: first piece %q is not valid UTF-8", i, first)
		}
		got := string(u.flush(u.write(first, text[i:])))
		if got != want {
			t.Errorf("split at %d: got %q, want %q", i, got, want)
		}
	}
}

func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{"", "plain", "q\"b\\s", "ctl\x00\x01\x1f\n\r\t", "<html>&", "é😀\u2028"} {
		enc := appendJSONString(nil, []byte(s))
		var back string
		if err := json.Unmarshal(enc, &back); err != nil || back != s {
			t.Errorf("appendJSONString(%q) = %s, decodes to %q, %v", s, enc, back, err)
		}
	}
}

func TestRuneCut(t *testing.T) {
	p := []byte("ab€c")
	for limit, want := range []int{0, 1, 2, 2, 2, 5, 6} {
		if got := runeCut(p, limit); got != want {
			t.Errorf("runeCut(%q, %d) = %d, want %d", p, limit, got, want)
		}
	}
}

func TestBuildEnvPrecedence(t *testing.T) {
	base := []string{"PATH=/bin", "FOO=base", "ANSIBLE_CALLBACKS_ENABLED=profile_tasks", "ANSIBLE_NOCOLOR=0", "BROKEN", "FOO=base2"}
	env := buildEnv(base, map[string]string{"FOO": "job", "ANSIBLE_NOCOLOR": "0"}, []string{
		"ANSIBLE_CALLBACK_PLUGINS=/p", "ANSIBLE_CALLBACKS_ENABLED=af_events", "AF_EVENTS_FD=3",
	}, "/job/.rte/tmp")
	want := []string{
		"PATH=/bin", "FOO=job", "ANSIBLE_CALLBACKS_ENABLED=af_events,profile_tasks", "ANSIBLE_NOCOLOR=0",
		"PYTHONUNBUFFERED=1", "PYTHONIOENCODING=utf-8", "ANSIBLE_RETRY_FILES_ENABLED=0",
		"ANSIBLE_LOCAL_TEMP=/job/.rte/tmp", "ANSIBLE_CALLBACK_PLUGINS=/p", "AF_EVENTS_FD=3",
	}
	if !slices.Equal(env, want) {
		t.Errorf("buildEnv =\n%q\nwant\n%q", env, want)
	}
}

// FuzzOutputPipeline feeds arbitrary output, split at an arbitrary point, through masking and
// UTF-8 repair: the result is valid UTF-8, holds no secret, and does not depend on the split.
func FuzzOutputPipeline(f *testing.F) {
	f.Add([]byte("hello secret world"), "secret", 9)
	f.Add([]byte("\xe2\x82\xacsecsecret\xff"), "secret", 4)
	f.Add([]byte("aaaaaaa"), "aa", 3)
	f.Fuzz(func(t *testing.T, text []byte, secret string, split int) {
		// Secrets are what an operator types; the property needs one that the U+FFFD repair
		// cannot create.
		secret = strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
				return r
			}
			return -1
		}, secret)
		if secret == "" {
			return
		}
		if split < 0 {
			split = -split
		}
		split %= len(text) + 1
		s := newSecretSet([]string{secret})
		whole := pipeline(s, [][]byte{text})
		parts := pipeline(s, [][]byte{text[:split], text[split:]})
		if whole != parts {
			t.Fatalf("split at %d changes the result: %q vs %q", split, whole, parts)
		}
		if !utf8.ValidString(whole) {
			t.Fatalf("result %q is not valid UTF-8", whole)
		}
		if strings.Contains(whole, secret) {
			t.Fatalf("result %q still holds the secret %q", whole, secret)
		}
	})
}

func TestParseVersion(t *testing.T) {
	tests := []struct{ out, want string }{
		{"ansible-playbook [core 2.14.18]\n  config file = None\n", "2.14.18"},
		{"ansible-playbook [core 2.17.0rc1]\n", "2.17.0rc1"},
		{"ansible-playbook 2.9.27\n  config file = /etc/ansible/ansible.cfg\n", "2.9.27"},
		{"Traceback (most recent call last):\n", ""},
		{"", ""},
	}
	for _, tt := range tests {
		got, err := parseVersion("ansible-playbook", []byte(tt.out))
		if got != tt.want || (tt.want == "") != (err != nil) {
			t.Errorf("parseVersion(%q) = %q, %v; want %q", tt.out, got, err, tt.want)
		}
	}
}
