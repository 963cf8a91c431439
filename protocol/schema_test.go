package protocol_test

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/rte-project/rte/protocol"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

const (
	docPath    = "../docs/protocol.md"
	schemaDir  = "../docs/schemas"
	schemaTail = ".schema.json"
)

// docBlock is one ```json block of docs/protocol.md together with the comment that names it:
// <!-- schema: NAME --> for an example of a schema, <!-- vector: NAME --> for a test vector.
type docBlock struct {
	kind string // "schema" or "vector"
	name string
	line int
	body []byte
}

var docComment = regexp.MustCompile(`^<!-- (schema|vector): ([a-z0-9.-]+) -->$`)

// readDocBlocks returns every json block of the protocol document. A json block without a
// naming comment, or a comment not followed by a json block, fails the test: an example that
// nothing checks is an example that will drift.
func readDocBlocks(tb testing.TB) []docBlock {
	tb.Helper()
	f, err := os.Open(docPath)
	if err != nil {
		tb.Fatalf("open the protocol document: %v", err)
	}
	defer f.Close()
	var (
		blocks  []docBlock
		pending *docBlock
		inBlock *docBlock
		inOther bool
		n       int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		switch {
		case inBlock != nil:
			if line == "```" {
				blocks = append(blocks, *inBlock)
				inBlock = nil
				continue
			}
			inBlock.body = append(inBlock.body, line...)
			inBlock.body = append(inBlock.body, '\n')
		case inOther:
			inOther = line != "```"
		case strings.HasPrefix(line, "```json"):
			if pending == nil {
				tb.Fatalf("%s:%d: json block has no <!-- schema: NAME --> or <!-- vector: NAME --> comment before it", docPath, n)
			}
			inBlock, pending = pending, nil
			inBlock.line = n
		case strings.HasPrefix(line, "```"):
			inOther = true
		case docComment.MatchString(line):
			m := docComment.FindStringSubmatch(line)
			pending = &docBlock{kind: m[1], name: m[2]}
		case pending != nil && strings.TrimSpace(line) != "":
			tb.Fatalf("%s:%d: the %s comment for %q is not followed by a ```json block", docPath, n, pending.kind, pending.name)
		}
	}
	if err := sc.Err(); err != nil {
		tb.Fatalf("read the protocol document: %v", err)
	}
	if inBlock != nil || pending != nil {
		tb.Fatalf("%s: ends inside a json block or after a dangling comment", docPath)
	}
	return blocks
}

// exampleFrames returns the message examples of the document as text frames, for seeding fuzzers.
func exampleFrames(tb testing.TB) [][]byte {
	tb.Helper()
	var out [][]byte
	for _, b := range readDocBlocks(tb) {
		if b.kind == "schema" && slices.Contains(protocol.Types(), b.name) {
			out = append(out, b.body)
		}
	}
	return out
}

// schemaSet is every schema file of docs/schemas, compiled, by name (file name without
// ".schema.json"), with the keys its top level requires.
type schemaSet struct {
	compiled map[string]*jsonschema.Schema
	required map[string][]string
}

func loadSchemas(tb testing.TB) schemaSet {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join(schemaDir, "*"+schemaTail))
	if err != nil || len(files) == 0 {
		tb.Fatalf("no schema files in %s (%v)", schemaDir, err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	set := schemaSet{compiled: map[string]*jsonschema.Schema{}, required: map[string][]string{}}
	for _, file := range files {
		abs, err := filepath.Abs(file)
		if err != nil {
			tb.Fatal(err)
		}
		name := strings.TrimSuffix(filepath.Base(file), schemaTail)
		sch, err := c.Compile(abs)
		if err != nil {
			tb.Fatalf("compile schema %s: %v", file, err)
		}
		raw, err := os.ReadFile(file)
		if err != nil {
			tb.Fatal(err)
		}
		var top struct {
			Schema               string          `json:"$schema"`
			Required             []string        `json:"required"`
			AdditionalProperties json.RawMessage `json:"additionalProperties"`
		}
		if err := json.Unmarshal(raw, &top); err != nil {
			tb.Fatalf("schema %s: %v", file, err)
		}
		if top.Schema != "https://json-schema.org/draft/2020-12/schema" {
			tb.Fatalf("schema %s: $schema is %q, want draft 2020-12", file, top.Schema)
		}
		if len(top.AdditionalProperties) > 0 {
			tb.Fatalf("schema %s restricts unknown keys (additionalProperties %s); the protocol says they are ignored", file, top.AdditionalProperties)
		}
		set.compiled[name] = sch
		set.required[name] = top.Required
	}
	return set
}

// valid reports whether doc passes the named schema, and the schema's complaint when not.
func (s schemaSet) valid(tb testing.TB, name string, doc []byte) (bool, string) {
	tb.Helper()
	sch, ok := s.compiled[name]
	if !ok {
		tb.Fatalf("no schema file %s%s in %s", name, schemaTail, schemaDir)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return false, "not JSON: " + err.Error()
	}
	if err := sch.Validate(inst); err != nil {
		return false, err.Error()
	}
	return true, ""
}

// strictUnmarshal decodes doc into v and fails on a key v has no field for: it catches a
// misspelt key in an example, which the decoder itself would silently ignore.
func strictUnmarshal(doc []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("more than one JSON value")
	}
	return nil
}

// recordData maps a record kind to the Go type of its data.
var recordData = map[string]func() any{
	protocol.KindStart:  func() any { return &protocol.StartData{} },
	protocol.KindOutput: func() any { return &protocol.OutputData{} },
	protocol.KindEvents: func() any { return &protocol.EventsData{} },
	protocol.KindLog:    func() any { return &protocol.LogData{} },
	protocol.KindEnd:    func() any { return &protocol.EndData{} },
}

// checkDecodes decodes an example the way its receiver would and checks it names only keys the
// Go types know.
func checkDecodes(t *testing.T, b docBlock) {
	t.Helper()
	switch {
	case slices.Contains(protocol.Types(), b.name):
		m, err := protocol.Decode(b.body)
		if err != nil {
			t.Fatalf("line %d: protocol.Decode refused the %s example: %v", b.line, b.name, err)
		}
		if m.Type() != b.name {
			t.Fatalf("line %d: the %s example decoded as a %s", b.line, b.name, m.Type())
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(b.body, &fields); err != nil {
			t.Fatal(err)
		}
		delete(fields, "type")
		rest, _ := json.Marshal(fields)
		strict := reflect.New(reflect.TypeOf(m).Elem()).Interface()
		if err := strictUnmarshal(rest, strict); err != nil {
			t.Fatalf("line %d: the %s example has a key %T does not know: %v", b.line, b.name, m, err)
		}
		if r, ok := m.(*protocol.Record); ok {
			if err := strictUnmarshal(r.Data, recordData[r.Kind]()); err != nil {
				t.Fatalf("line %d: the record example's %s data has a key the Go type does not know: %v", b.line, r.Kind, err)
			}
		}
	case b.name == "register-request":
		if err := strictUnmarshal(b.body, &protocol.RegisterRequest{}); err != nil {
			t.Fatalf("line %d: register request example does not decode into protocol.RegisterRequest: %v", b.line, err)
		}
	case b.name == "register-response":
		if err := strictUnmarshal(b.body, &protocol.RegisterResponse{}); err != nil {
			t.Fatalf("line %d: register response example does not decode into protocol.RegisterResponse: %v", b.line, err)
		}
	case strings.HasPrefix(b.name, "record-data-"):
		newData, ok := recordData[strings.TrimPrefix(b.name, "record-data-")]
		if !ok {
			t.Fatalf("line %d: %s names no record kind", b.line, b.name)
		}
		if err := strictUnmarshal(b.body, newData()); err != nil {
			t.Fatalf("line %d: %s example does not decode into its Go type: %v", b.line, b.name, err)
		}
	default:
		t.Fatalf("line %d: schema comment names %q, which is no message type, register-request/response or record-data-<kind>", b.line, b.name)
	}
}

// TestDocExamples checks every example of docs/protocol.md against its schema and the Go
// decoder, and that every message type and every schema file has an example.
func TestDocExamples(t *testing.T) {
	schemas := loadSchemas(t)
	examples := map[string]int{}
	for _, b := range readDocBlocks(t) {
		if b.kind != "schema" {
			continue
		}
		examples[b.name]++
		t.Run(b.name, func(t *testing.T) {
			if ok, why := schemas.valid(t, b.name, b.body); !ok {
				t.Fatalf("line %d: the %s example does not pass %s%s: %s", b.line, b.name, b.name, schemaTail, why)
			}
			checkDecodes(t, b)
		})
	}
	for _, typ := range protocol.Types() {
		if _, ok := schemas.compiled[typ]; !ok {
			t.Errorf("message type %q has no schema file %s/%s%s", typ, schemaDir, typ, schemaTail)
		}
		if examples[typ] != 1 {
			t.Errorf("message type %q has %d examples in %s, want exactly one", typ, examples[typ], docPath)
		}
	}
	for name := range schemas.compiled {
		if examples[name] == 0 {
			t.Errorf("schema %s%s has no example in %s", name, schemaTail, docPath)
		}
	}
}

// TestSchemaRequiredMatchesDecode removes, then nulls, each top-level key of each message
// example: the schema must refuse exactly when the decoder answers missing_field, so the
// schemas' "required" lists and the decoder's cannot differ.
func TestSchemaRequiredMatchesDecode(t *testing.T) {
	schemas := loadSchemas(t)
	for _, b := range readDocBlocks(t) {
		if b.kind != "schema" || !slices.Contains(protocol.Types(), b.name) {
			continue
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(b.body, &fields); err != nil {
			t.Fatal(err)
		}
		for key := range fields {
			for _, how := range []string{"without", "null"} {
				mutated := map[string]json.RawMessage{}
				for k, v := range fields {
					mutated[k] = v
				}
				if how == "without" {
					delete(mutated, key)
				} else {
					mutated[key] = json.RawMessage("null")
				}
				doc, _ := json.Marshal(mutated)
				required := slices.Contains(schemas.required[b.name], key)
				schemaOK, why := schemas.valid(t, b.name, doc)
				_, err := protocol.Decode(doc)
				var de *protocol.DecodeError
				missing := errors.As(err, &de) && de.Code == protocol.ErrMissingField
				if missing != required {
					t.Errorf("%s %s %q: Decode answered %v, but the schema lists %q as required=%v", b.name, how, key, err, key, required)
				}
				if how == "without" && schemaOK == required {
					t.Errorf("%s %s %q: schema valid=%v (%s), want %v", b.name, how, key, schemaOK, why, !required)
				}
				if how == "null" && schemaOK {
					t.Errorf("%s with %q null: the schema accepted it, want refused (optional keys are omitted, not null)", b.name, key)
				}
			}
		}
	}
}

// TestSchemasAgreeWithDecode feeds the same messages to the schemas and to Decode.
func TestSchemasAgreeWithDecode(t *testing.T) {
	schemas := loadSchemas(t)
	const (
		hash  = "sha256:2d09cc910dd77738e3e9a12b5d2baea13723f3ffaf32dde9dc70a050755048ba"
		at    = `"2026-12-02T10:00:00Z"`
		hello = `"protocol":1,"name":"rte01","version":"1.0.0","mode":"inbound","files":"transfer","max_jobs":10`
	)
	for _, tc := range []struct {
		name, schema, in string
		ok               bool
	}{
		// Both refuse.
		{"ack without seq", "ack", `{"type":"ack","job":"j1"}`, false},
		{"ack seq as string", "ack", `{"type":"ack","job":"j1","seq":"7"}`, false},
		{"ack negative seq", "ack", `{"type":"ack","job":"j1","seq":-1}`, false},
		{"ack seq fraction", "ack", `{"type":"ack","job":"j1","seq":1.5}`, false},
		{"ack type not a string", "ack", `{"type":7,"job":"j1","seq":1}`, false},
		{"ack wrong type", "ack", `{"type":"hello","job":"j1","seq":1}`, false},
		{"not an object", "ack", `["ack"]`, false},
		{"cancel job with slash", "job.cancel", `{"type":"job.cancel","job":"../etc"}`, false},
		{"cancel job too long", "job.cancel", `{"type":"job.cancel","job":"` + strings.Repeat("a", 129) + `"}`, false},
		{"cancel empty job", "job.cancel", `{"type":"job.cancel","job":""}`, false},
		{"hello without name", "hello", `{"type":"hello","protocol":1,"version":"1","mode":"inbound","files":"local","max_jobs":0}`, false},
		{"hello protocol 0", "hello", `{"type":"hello","protocol":0,"name":"r","version":"1","mode":"inbound","files":"local","max_jobs":0}`, false},
		{"hello bad mode", "hello", `{"type":"hello","protocol":1,"name":"r","version":"1","mode":"database","files":"local","max_jobs":0}`, false},
		{"hello negative max_jobs", "hello", `{"type":"hello","protocol":1,"name":"r","version":"1","mode":"inbound","files":"local","max_jobs":-1}`, false},
		{"hello bad running job", "hello", `{"type":"hello",` + hello + `,"running":["a b"]}`, false},
		{"hello spooled without job", "hello", `{"type":"hello",` + hello + `,"spooled":[{"last_seq":3}]}`, false},
		{"welcome without approved", "welcome", `{"type":"welcome","protocol":1,"node":"a"}`, false},
		{"welcome bad acked job", "welcome", `{"type":"welcome","protocol":1,"node":"a","approved":true,"acked":{"a/b":1}}`, false},
		{"welcome negative acked", "welcome", `{"type":"welcome","protocol":1,"node":"a","approved":true,"acked":{"j":-1}}`, false},
		{"start without playbook", "job.start", `{"type":"job.start","job":"j1"}`, false},
		{"start empty playbook", "job.start", `{"type":"job.start","job":"j1","playbook":""}`, false},
		{"start verbosity 7", "job.start", `{"type":"job.start","job":"j1","playbook":"p.yml","verbosity":7}`, false},
		{"start extravars array", "job.start", `{"type":"job.start","job":"j1","playbook":"p.yml","extravars":[1]}`, false},
		{"start unknown secret", "job.start", `{"type":"job.start","job":"j1","playbook":"p.yml","secrets":{"ssh_key":"x"}}`, false},
		{"start files without playbooks", "job.start", `{"type":"job.start","job":"j1","playbook":"p.yml","files":{}}`, false},
		{"start uppercase hash", "job.start", `{"type":"job.start","job":"j1","playbook":"p.yml","files":{"playbooks":{"hash":"` + strings.ToUpper(hash) + `"}}}`, false},
		{"start negative size", "job.start", `{"type":"job.start","job":"j1","playbook":"p.yml","files":{"playbooks":{"hash":"` + hash + `","size":-1}}}`, false},
		{"start env name with =", "job.start", `{"type":"job.start","job":"j1","playbook":"p.yml","env":{"A=B":"x"}}`, false},
		{"start env name with -", "job.start", `{"type":"job.start","job":"j1","playbook":"p.yml","env":{"A-B":"x"}}`, false},
		{"start env name of 129", "job.start", `{"type":"job.start","job":"j1","playbook":"p.yml","env":{"` + strings.Repeat("A", 129) + `":"x"}}`, false},
		{"start empty env name", "job.start", `{"type":"job.start","job":"j1","playbook":"p.yml","env":{"":"x"}}`, false},
		{"start tag with comma", "job.start", `{"type":"job.start","job":"j1","playbook":"p.yml","tags":["a,b"]}`, false},
		{"start blank skip tag", "job.start", `{"type":"job.start","job":"j1","playbook":"p.yml","skip_tags":[" "]}`, false},
		{"refused unknown code", "job.refused", `{"type":"job.refused","job":"j1","code":"busy","message":"m"}`, false},
		{"want without hashes", "bundle.want", `{"type":"bundle.want","job":"j1"}`, false},
		{"want short hash", "bundle.want", `{"type":"bundle.want","job":"j1","hashes":["sha256:abc"]}`, false},
		{"frames empty", "bundle.frames", `{"type":"bundle.frames","hash":"` + hash + `","size":0,"frames":[]}`, false},
		{"frame of 0 bytes", "bundle.frames", `{"type":"bundle.frames","hash":"` + hash + `","size":0,"frames":[{"size":0,"sha256":"` + hash[7:] + `"}]}`, false},
		{"frame hash prefixed", "bundle.frames", `{"type":"bundle.frames","hash":"` + hash + `","size":1,"frames":[{"size":1,"sha256":"` + hash + `"}]}`, false},
		{"frames without frames", "bundle.frames", `{"type":"bundle.frames","hash":"` + hash + `","size":1}`, false},
		{"ranges negative offset", "bundle.ranges", `{"type":"bundle.ranges","job":"j","hash":"` + hash + `","ranges":[{"offset":-1,"size":1}]}`, false},
		{"ranges empty range", "bundle.ranges", `{"type":"bundle.ranges","job":"j","hash":"` + hash + `","ranges":[{"offset":0,"size":0}]}`, false},
		{"ranges without job", "bundle.ranges", `{"type":"bundle.ranges","hash":"` + hash + `","ranges":[]}`, false},
		{"want frames short hash", "bundle.want", `{"type":"bundle.want","job":"j1","hashes":[],"frames":["sha256:abc"]}`, false},
		{"welcome bad feature", "welcome", `{"type":"welcome","protocol":1,"node":"a","approved":true,"features":["A B"]}`, false},
		{"end hash without prefix", "bundle.end", `{"type":"bundle.end","hash":"` + hash[7:] + `","size":1}`, false},
		{"missing without reason", "bundle.missing", `{"type":"bundle.missing","hash":"` + hash + `"}`, false},
		{"record seq 0", "record", `{"type":"record","job":"j","seq":0,"kind":"output","at":` + at + `,"data":{"text":""}}`, false},
		{"record unknown kind", "record", `{"type":"record","job":"j","seq":1,"kind":"stdout","at":` + at + `,"data":{"text":""}}`, false},
		{"record data a string", "record", `{"type":"record","job":"j","seq":1,"kind":"output","at":` + at + `,"data":"text"}`, false},
		{"record at not a time", "record", `{"type":"record","job":"j","seq":1,"kind":"output","at":"yesterday","data":{"text":""}}`, false},
		{"record without at", "record", `{"type":"record","job":"j","seq":1,"kind":"output","data":{"text":""}}`, false},
		{"capacity without draining", "capacity", `{"type":"capacity","running":1,"max_jobs":2}`, false},
		{"settings negative", "settings", `{"type":"settings","max_jobs":-2}`, false},
		{"check empty id", "check", `{"type":"check","id":"","targets":[],"timeout_ms":1}`, false},
		{"check port too high", "check", `{"type":"check","id":"c","targets":[{"host":"h","port":70000,"transport":"ssh"}],"timeout_ms":1}`, false},
		{"check empty host", "check", `{"type":"check","id":"c","targets":[{"host":"","transport":"ssh"}],"timeout_ms":1}`, false},
		{"check telnet", "check", `{"type":"check","id":"c","targets":[{"host":"h","transport":"telnet"}],"timeout_ms":1}`, false},
		{"result bad status", "check.result", `{"type":"check.result","id":"c","results":[{"status":"ok"}]}`, false},
		{"error empty code", "error", `{"type":"error","code":"","message":"m"}`, false},
		// Both accept.
		{"ack seq 0", "ack", `{"type":"ack","job":"j1","seq":0}`, true},
		{"ack with unknown keys", "ack", `{"type":"ack","job":"j1","seq":3,"x_later":{"a":[1]}}`, true},
		{"job id of 128", "job.cancel", `{"type":"job.cancel","job":"` + strings.Repeat("a", 128) + `"}`, true},
		{"job id punctuation", "job.cancel", `{"type":"job.cancel","job":"a.B_c-9"}`, true},
		{"minimal hello", "hello", `{"type":"hello",` + hello + `}`, true},
		{"hello protocol 2", "hello", `{"type":"hello","protocol":2,"name":"r","version":"1","mode":"outbound","files":"local","max_jobs":0}`, true},
		{"minimal welcome", "welcome", `{"type":"welcome","protocol":1,"node":"","approved":false}`, true},
		{"minimal start", "job.start", `{"type":"job.start","job":"j1","playbook":"p.yml"}`, true},
		{"start env and tags", "job.start", `{"type":"job.start","job":"j1","playbook":"p.yml","env":{"_x9":"1","` + strings.Repeat("A", 128) + `":""},"tags":["a b"],"skip_tags":["x"]}`, true},
		{"one frame", "bundle.frames", `{"type":"bundle.frames","hash":"` + hash + `","size":5,"frames":[{"size":5,"sha256":"` + hash[7:] + `"}]}`, true},
		{"no ranges", "bundle.ranges", `{"type":"bundle.ranges","job":"j","hash":"` + hash + `","ranges":[]}`, true},
		{"welcome unknown feature", "welcome", `{"type":"welcome","protocol":1,"node":"a","approved":true,"features":["later.thing"]}`, true},
		{"want no hashes", "bundle.want", `{"type":"bundle.want","job":"j1","hashes":[]}`, true},
		{"record at with offset", "record", `{"type":"record","job":"j","seq":1,"kind":"log","at":"2026-12-02T11:00:00.5+01:00","data":{"level":"info","message":"m"}}`, true},
		{"check no targets", "check", `{"type":"check","id":"c","targets":[],"timeout_ms":0}`, true},
		{"error unknown code", "error", `{"type":"error","code":"from_the_future","message":""}`, true},
		{"rejected bare", "rejected", `{"type":"rejected"}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			schemaOK, why := schemas.valid(t, tc.schema, []byte(tc.in))
			_, err := protocol.Decode([]byte(tc.in))
			if schemaOK != tc.ok || (err == nil) != tc.ok {
				t.Fatalf("%s\nwant both to say ok=%v; schema ok=%v (%s), Decode error=%v", tc.in, tc.ok, schemaOK, why, err)
			}
		})
	}
}

// TestSchemaStricterThanDecode pins the documented cases where a schema refuses what Decode
// lets through; if Decode starts refusing one, the document's list must change with it.
func TestSchemaStricterThanDecode(t *testing.T) {
	schemas := loadSchemas(t)
	const at = `"2026-12-02T10:00:00Z"`
	for _, tc := range []struct{ name, schema, in string }{
		{"optional key null", "job.start", `{"type":"job.start","job":"j1","playbook":"p.yml","limit":null}`},
		{"output data without text", "record", `{"type":"record","job":"j","seq":1,"kind":"output","at":` + at + `,"data":{}}`},
		{"end data with unknown status", "record", `{"type":"record","job":"j","seq":2,"kind":"end","at":` + at + `,"data":{"status":"ok","exit_code":0}}`},
		{"end data without exit code", "record", `{"type":"record","job":"j","seq":2,"kind":"end","at":` + at + `,"data":{"status":"success"}}`},
		{"log data with bad level", "record", `{"type":"record","job":"j","seq":3,"kind":"log","at":` + at + `,"data":{"level":"debug","message":"m"}}`},
		{"events not an array", "record", `{"type":"record","job":"j","seq":3,"kind":"events","at":` + at + `,"data":{"events":{}}}`},
		{"start data without pid", "record", `{"type":"record","job":"j","seq":1,"kind":"start","at":` + at + `,"data":{"instance":"i","playbook":"p"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if ok, _ := schemas.valid(t, tc.schema, []byte(tc.in)); ok {
				t.Errorf("%s: the %s schema accepted it, want refused", tc.in, tc.schema)
			}
			if _, err := protocol.Decode([]byte(tc.in)); err != nil {
				t.Errorf("%s: Decode refused it (%v); update the list of differences in %s", tc.in, err, docPath)
			}
		})
	}
}

// TestSchemaPatternsMatchValidate checks the job id and hash patterns of the schemas against
// protocol.ValidJobID and protocol.ValidHash.
func TestSchemaPatternsMatchValidate(t *testing.T) {
	schemas := loadSchemas(t)
	hex64 := strings.Repeat("0123456789abcdef", 4)
	for _, id := range []string{"1", "1042", "a.B_c-9", "..", ".", "...", ".a", strings.Repeat("x", 128), strings.Repeat("x", 129),
		"", "a/b", "a b", "j\n", "é", "a\\b", "a:b", "a\x00"} {
		doc, _ := json.Marshal(map[string]any{"type": "job.cancel", "job": id})
		if ok, why := schemas.valid(t, "job.cancel", doc); ok != protocol.ValidJobID(id) {
			t.Errorf("job id %q: schema ok=%v (%s), protocol.ValidJobID=%v", id, ok, why, !ok)
		}
	}
	for _, h := range []string{"sha256:" + hex64, "sha256:" + strings.ToUpper(hex64), "sha256:" + hex64[1:],
		"sha256:" + hex64 + "0", "sha512:" + hex64, hex64, "sha256:" + hex64 + "\n", "sha256:" + hex64[:63] + "g"} {
		doc, _ := json.Marshal(map[string]any{"type": "bundle.end", "hash": h, "size": 1})
		if ok, why := schemas.valid(t, "bundle.end", doc); ok != protocol.ValidHash(h) {
			t.Errorf("hash %q: schema ok=%v (%s), protocol.ValidHash=%v", h, ok, why, !ok)
		}
	}
}

// TestSchemasAllowUnknownKeys adds a key no version knows to each message example: the schema
// and Decode must both still accept it.
func TestSchemasAllowUnknownKeys(t *testing.T) {
	schemas := loadSchemas(t)
	for _, b := range readDocBlocks(t) {
		if b.kind != "schema" {
			continue
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(b.body, &fields); err != nil {
			t.Fatal(err)
		}
		fields["x_added_in_v1_9"] = json.RawMessage(`{"nested":[true,null]}`)
		doc, _ := json.Marshal(fields)
		if ok, why := schemas.valid(t, b.name, doc); !ok {
			t.Errorf("%s with an unknown key: schema refused it: %s", b.name, why)
		}
		if slices.Contains(protocol.Types(), b.name) {
			if _, err := protocol.Decode(doc); err != nil {
				t.Errorf("%s with an unknown key: Decode refused it: %v", b.name, err)
			}
		}
	}
}

// TestDocVectors recomputes the worked examples of the document.
func TestDocVectors(t *testing.T) {
	seen := map[string]bool{}
	for _, b := range readDocBlocks(t) {
		if b.kind != "vector" {
			continue
		}
		seen[b.name] = true
		switch b.name {
		case "token-fingerprint":
			var v struct {
				Token            string
				TokenFingerprint string `json:"token_fingerprint"`
			}
			mustStrict(t, b, &v)
			if got := protocol.TokenFingerprint(v.Token); got != v.TokenFingerprint {
				t.Errorf("line %d: TokenFingerprint(%q) = %s, the document says %s", b.line, v.Token, got, v.TokenFingerprint)
			}
		case "chunk":
			var v struct {
				Hash       string
				Offset     uint64
				PayloadHex string `json:"payload_hex"`
				FrameHex   string `json:"frame_hex"`
			}
			mustStrict(t, b, &v)
			frame, _ := hex.DecodeString(v.FrameHex)
			payload, _ := hex.DecodeString(v.PayloadHex)
			c, err := protocol.DecodeChunk(frame)
			if err != nil || c.HashName() != v.Hash || c.Offset != v.Offset || !bytes.Equal(c.Payload, payload) {
				t.Errorf("line %d: DecodeChunk gave hash %s offset %d payload %x (%v), the document says %s %d %x",
					b.line, c.HashName(), c.Offset, c.Payload, err, v.Hash, v.Offset, payload)
			}
			h, err := protocol.ParseHash(v.Hash)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := protocol.EncodeChunk(h, v.Offset, payload); err != nil || !bytes.Equal(got, frame) {
				t.Errorf("line %d: EncodeChunk = %x (%v), the document says %x", b.line, got, err, frame)
			}
		case "sealed-secret":
			var v struct {
				Token, Job, Plaintext, Sealed string
				KeyHex                        string `json:"key_hex"`
			}
			mustStrict(t, b, &v)
			// Follow the document's recipe with the standard library alone, so the recipe
			// and not just protocol's code is what is checked.
			key, err := hkdf.Key(sha256.New, []byte(v.Token), []byte(v.Job), "rte.v1 secrets", 32)
			if err != nil {
				t.Fatal(err)
			}
			if hex.EncodeToString(key) != v.KeyHex {
				t.Errorf("line %d: HKDF key = %x, the document says %s", b.line, key, v.KeyHex)
			}
			raw, err := base64.StdEncoding.DecodeString(v.Sealed)
			if err != nil {
				t.Fatalf("line %d: sealed value is not standard base64: %v", b.line, err)
			}
			block, _ := aes.NewCipher(key)
			gcm, _ := cipher.NewGCM(block)
			plain, err := gcm.Open(nil, raw[:12], raw[12:], nil)
			if err != nil || string(plain) != v.Plaintext {
				t.Errorf("line %d: AES-GCM open gave %q, %v; the document says %q", b.line, plain, err, v.Plaintext)
			}
			if got, err := protocol.OpenSecret(v.Token, v.Job, v.Sealed); err != nil || got != v.Plaintext {
				t.Errorf("line %d: OpenSecret = %q, %v; the document says %q", b.line, got, err, v.Plaintext)
			}
		default:
			t.Errorf("line %d: unknown vector %q", b.line, b.name)
		}
	}
	for _, want := range []string{"token-fingerprint", "chunk", "sealed-secret"} {
		if !seen[want] {
			t.Errorf("%s has no %q vector", docPath, want)
		}
	}
}

func mustStrict(t *testing.T, b docBlock, v any) {
	t.Helper()
	if err := strictUnmarshal(b.body, v); err != nil {
		t.Fatalf("line %d: %s vector: %v", b.line, b.name, err)
	}
}
