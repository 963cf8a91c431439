package protocol_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rte-project/rte/protocol"
)

// FuzzJobStartValidate decodes job.start frames built from a fuzzed id, limit and timeout, and
// holds every accepted one to what the RTE relies on: the job directory made from the id is a
// strict child of the work directory (never the directory itself, its parent or anything
// beside it), the timeout is a positive duration that did not wrap, and the limit names no
// file for ansible to read.
func FuzzJobStartValidate(f *testing.F) {
	for _, seed := range []struct {
		id, limit string
		timeout   int64
	}{
		{"1042", "web", 3600}, {"..", "", 0}, {".", "", 0}, {"...", "all", 1}, {".a", "", 0},
		{"a/..", "", 0}, {"x", "@/etc/passwd", 0}, {"x", "web,@hosts", 0}, {"x", "", 10000000000},
		{"x", "", protocol.MaxTimeoutS}, {"x", "", protocol.MaxTimeoutS + 1}, {"x", "", -1},
		{strings.Repeat("y", 128), "", 0}, {"a\x00b", "", 0}, {"", "", 0},
	} {
		f.Add(seed.id, seed.limit, seed.timeout)
	}
	const work = "/var/lib/rte/work/jobs"
	f.Fuzz(func(t *testing.T, id, limit string, timeout int64) {
		frame, err := json.Marshal(map[string]any{"type": "job.start", "job": id, "playbook": "site.yml",
			"limit": limit, "timeout_s": timeout})
		if err != nil {
			t.Skip()
		}
		m, err := protocol.Decode(frame)
		if err != nil {
			return
		}
		js := m.(*protocol.JobStart)
		dir := filepath.Join(work, js.Job)
		if filepath.Dir(dir) != work || filepath.Base(dir) != js.Job {
			t.Fatalf("job id %q accepted, but its directory %s is not a strict child of %s", js.Job, dir, work)
		}
		if js.TimeoutS < 0 || js.TimeoutS > protocol.MaxTimeoutS {
			t.Fatalf("timeout_s %d accepted, want 0 to %d", js.TimeoutS, protocol.MaxTimeoutS)
		}
		if d := time.Duration(js.TimeoutS) * time.Second; d < 0 || int64(d/time.Second) != int64(js.TimeoutS) {
			t.Fatalf("timeout_s %d accepted, but it overflows a duration (%v)", js.TimeoutS, d)
		}
		if strings.Contains(js.Limit, "@") {
			t.Fatalf("limit %q accepted, but ansible reads @ as a file reference", js.Limit)
		}
	})
}

// TestJobStartRefusesHostileFields names the field and the reason of each refusal of issue 10,
// and of the env-name and tag rules that moved from the RTE's jobs into the protocol (issue 12).
func TestJobStartRefusesHostileFields(t *testing.T) {
	for _, c := range []struct {
		name, frame, want string
	}{
		{"job dot-dot", `{"type":"job.start","job":"..","playbook":"p"}`, `job: ".." is not 1 to 128 of [A-Za-z0-9._-], and not "." or ".."`},
		{"job dot", `{"type":"job.start","job":".","playbook":"p"}`, `job: "." is not`},
		{"cancel dot-dot", `{"type":"job.cancel","job":".."}`, `job: ".." is not`},
		{"limit file", `{"type":"job.start","job":"j","playbook":"p","limit":"@/etc/passwd"}`, `limit: "@/etc/passwd" contains @`},
		{"limit file later", `{"type":"job.start","job":"j","playbook":"p","limit":"web,@/etc/passwd"}`, `limit: "web,@/etc/passwd" contains @`},
		{"timeout overflow", `{"type":"job.start","job":"j","playbook":"p","timeout_s":10000000000}`, "timeout_s: must be 0 (none) to 604800 seconds (7 days), got 10000000000"},
		{"timeout one over", `{"type":"job.start","job":"j","playbook":"p","timeout_s":604801}`, "got 604801"},
		{"env name with =", `{"type":"job.start","job":"j","playbook":"p","env":{"A=B":"x"}}`, `env: "A=B" is not a variable name (1 to 128 of [A-Za-z_][A-Za-z0-9_]*)`},
		{"env name too long", `{"type":"job.start","job":"j","playbook":"p","env":{"` + strings.Repeat("A", 129) + `":"x"}}`, "is not a variable name"},
		{"env name first of several", `{"type":"job.start","job":"j","playbook":"p","env":{"OK":"1","9x":"2","b-c":"3"}}`, `env: "9x"`},
		{"tag with comma", `{"type":"job.start","job":"j","playbook":"p","tags":["a,b"]}`, `tags[0]: "a,b" must be a non-empty tag without commas`},
		{"blank skip tag", `{"type":"job.start","job":"j","playbook":"p","skip_tags":["x","  "]}`, `skip_tags[1]: "  " must be`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := protocol.Decode([]byte(c.frame))
			de, ok := err.(*protocol.DecodeError)
			if !ok || de.Code != protocol.ErrInvalid || !strings.Contains(de.Message, c.want) {
				t.Fatalf("Decode(%s) = %v, want an invalid error containing %q", c.frame, err, c.want)
			}
		})
	}
	for _, ok := range []string{"...", ".a", "a..b", "1042"} {
		if !protocol.ValidJobID(ok) {
			t.Errorf("ValidJobID(%q) = false, want true: only . and .. are refused", ok)
		}
	}
	for name, ok := range map[string]bool{"A": true, "_": true, "a_1": true, strings.Repeat("x", 128): true,
		"": false, "1A": false, "A=B": false, "A-B": false, "A B": false, "É": false, "A\x00": false, strings.Repeat("x", 129): false} {
		if protocol.ValidEnvName(name) != ok {
			t.Errorf("ValidEnvName(%q) = %v, want %v", name, !ok, ok)
		}
	}
	if _, err := protocol.Decode([]byte(`{"type":"job.start","job":"j","playbook":"p","timeout_s":604800,"limit":"web:&db"}`)); err != nil {
		t.Fatalf("a 7-day timeout and a plain limit were refused: %v", err)
	}
}

// TestDecodeNamesDepth: a frame nested too deep is reported as such, not as "not a JSON object".
func TestDecodeNamesDepth(t *testing.T) {
	frame := `{"type":"ack","job":"j","seq":1,"x":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`
	_, err := protocol.Decode([]byte(frame))
	if err == nil || !strings.Contains(err.Error(), "nested deeper than 10000 levels") {
		t.Fatalf("Decode of a frame nested 10001 deep = %v, want it to name the nesting limit", err)
	}
}

// TestImageReferences: job.start's image and hello's images are refused, naming the field,
// unless they are plain image references (patterns with * in hello).
func TestImageReferences(t *testing.T) {
	for _, c := range []struct {
		name, frame, want string
	}{
		{"space", `{"type":"job.start","job":"j","playbook":"p","image":"rte:dev --privileged"}`, `image: "rte:dev --privileged" is not an image reference`},
		{"option", `{"type":"job.start","job":"j","playbook":"p","image":"-v"}`, `image: "-v" is not an image reference`},
		{"control", `{"type":"job.start","job":"j","playbook":"p","image":"rte\u0000"}`, `image: "rte\x00"`},
		{"pattern in a job", `{"type":"job.start","job":"j","playbook":"p","image":"ee-*"}`, `image: "ee-*" is not`},
		{"too long", `{"type":"job.start","job":"j","playbook":"p","image":"` + strings.Repeat("a", 256) + `"}`, `image: "aaaa`},
		{"hello pattern", `{"type":"hello","protocol":1,"name":"r","version":"1","mode":"inbound","files":"transfer","max_jobs":0,"images":["rte:dev","ee *"]}`, `images[1]: "ee *" is not an image reference or pattern`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := protocol.Decode([]byte(c.frame))
			de, ok := err.(*protocol.DecodeError)
			if !ok || de.Code != protocol.ErrInvalid || !strings.Contains(de.Message, c.want) {
				t.Fatalf("Decode(%s) = %v, want an invalid error containing %q", c.frame, err, c.want)
			}
		})
	}
	for ref, ok := range map[string]bool{"rte:dev": true, "registry.example:5000/team/ee-2.16:1.0": true,
		"alpine@sha256:" + strings.Repeat("a", 64): true, strings.Repeat("a", 255): true,
		"": false, ":tag": false, "/x": false, "a b": false, "a*": false, "a\n": false, strings.Repeat("a", 256): false} {
		if protocol.ValidImage(ref) != ok {
			t.Errorf("ValidImage(%q) = %v, want %v", ref, !ok, ok)
		}
	}
	if !protocol.ValidImagePattern("registry.example/ee-*:*") || !protocol.ValidImagePattern("*") || protocol.ValidImagePattern("a?") {
		t.Errorf("ValidImagePattern: * must be allowed, ? not")
	}
	images := []string{"rte:dev", "registry.example/ee-*", "registry.example/team/*:2.16"}
	for image, ok := range map[string]bool{"rte:dev": true, "registry.example/ee-216:1": true, "registry.example/team/ee:2.16": true,
		"rte:dev2": false, "registry.example/ee-x/../evil": false, "registry.example/ee-a/b": false,
		"other.example/ee-216": false, "registry.example/team/ee:2.17": false, "": false} {
		if protocol.ImageAllowed(images, image) != ok {
			t.Errorf("ImageAllowed(%q, %q) = %v, want %v", images, image, !ok, ok)
		}
	}
	if protocol.ImageAllowed(nil, "rte:dev") {
		t.Error("ImageAllowed with no images allowed an image")
	}
	msg, err := protocol.Decode([]byte(`{"type":"job.start","job":"j","playbook":"p","image":"registry.example/ee-216:1"}`))
	if err != nil || msg.(*protocol.JobStart).Image != "registry.example/ee-216:1" {
		t.Fatalf("Decode of an image = %v, %v", msg, err)
	}
}
