package jobs

import (
	"bytes"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/rte-project/rte/jobs/afevents"
	"github.com/rte-project/rte/protocol"
)

// eventsFD is the descriptor the af_events plugin writes to: ExtraFiles[0] in the child.
const eventsFD = 3

// privateName is the Manager's own directory inside a job directory.
const privateName = ".rte"

// Secret names of JobStart.Secrets and the ansible-playbook option each is given through.
// ansible-core 2.14 reads both files and strips surrounding whitespace.
var secretOptions = map[string]string{
	"vault_password":  "--vault-password-file",
	"become_password": "--become-password-file",
}

// private is what the Manager writes into a job's directory for ansible.
type private struct {
	dir       string            // <job>/.rte, 0700
	tmp       string            // ANSIBLE_LOCAL_TEMP
	extravars string            // -e @file; "" without extravars
	secrets   map[string]string // secret name -> file
	// values are the secrets the engine hands over itself (secret name -> value), when
	// secrets holds paths in the engine's secretDir rather than files on the RTE's disk.
	values map[string]string
}

// writePrivate writes extravars and opened secrets to 0600 files, so neither ever appears on
// a command line (visible to every local user in /proc) or in the environment. With a
// secretDir (the engine's), the secrets are not written at all: their paths are there and
// their values stay in p.values for the engine to hand over.
func writePrivate(jobDir string, js *protocol.JobStart, secrets map[string]string, secretDir string) (private, error) {
	p := private{dir: filepath.Join(jobDir, privateName), secrets: map[string]string{}, values: map[string]string{}}
	p.tmp = filepath.Join(p.dir, "tmp")
	if err := os.Mkdir(p.dir, 0o700); err != nil {
		return p, fmt.Errorf("make %s: %w", p.dir, err)
	}
	if err := os.Mkdir(p.tmp, 0o700); err != nil {
		return p, fmt.Errorf("make %s: %w", p.tmp, err)
	}
	if ev := bytes.TrimSpace(js.Extravars); len(ev) > 0 && !bytes.Equal(ev, []byte("null")) {
		p.extravars = filepath.Join(p.dir, "extravars.json")
		if err := writeFile0600(p.extravars, ev); err != nil {
			return p, err
		}
	}
	for _, name := range sortedKeys(secrets) {
		if _, ok := secretOptions[name]; !ok {
			continue // protocol.JobStart.Validate refuses other names
		}
		if secretDir != "" {
			p.secrets[name] = path.Join(secretDir, name)
			p.values[name] = secrets[name]
			continue
		}
		file := filepath.Join(p.dir, name)
		if err := writeFile0600(file, []byte(secrets[name])); err != nil {
			return p, err
		}
		p.secrets[name] = file
	}
	return p, nil
}

// writeFile0600 creates path with mode 0600 from the start: O_EXCL, so nothing that was
// there before (a link planted by someone else) is followed.
func writeFile0600(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// buildArgs is ansible-playbook's command line. Values go in the --opt=value form, so a value
// that starts with "-" is never taken for an option.
func buildArgs(js *protocol.JobStart, ws Workspace, p private) []string {
	args := []string{ws.Playbook}
	for _, inv := range ws.Inventories {
		args = append(args, "--inventory="+inv)
	}
	if js.Limit != "" {
		args = append(args, "--limit="+js.Limit)
	}
	if len(js.Tags) > 0 {
		args = append(args, "--tags="+strings.Join(js.Tags, ","))
	}
	if len(js.SkipTags) > 0 {
		args = append(args, "--skip-tags="+strings.Join(js.SkipTags, ","))
	}
	if js.Check {
		args = append(args, "--check")
	}
	if js.Diff {
		args = append(args, "--diff")
	}
	if js.Verbosity > 0 {
		args = append(args, "-"+strings.Repeat("v", js.Verbosity))
	}
	if js.Forks > 0 {
		args = append(args, "--forks="+strconv.Itoa(js.Forks))
	}
	if p.extravars != "" {
		args = append(args, "--extra-vars=@"+p.extravars)
	}
	for _, name := range sortedKeys(p.secrets) {
		args = append(args, secretOptions[name]+"="+p.secrets[name])
	}
	return args
}

// Settings every job gets unless its env says otherwise: plain text, output as it happens,
// UTF-8 whatever the locale, no .retry files next to the playbooks.
var defaultEnv = [][2]string{
	{"ANSIBLE_NOCOLOR", "1"},
	{"PYTHONUNBUFFERED", "1"},
	{"PYTHONIOENCODING", "utf-8"},
	{"ANSIBLE_RETRY_FILES_ENABLED", "0"},
}

// buildEnv is ansible's whole environment: base (the operator's allowlist), the defaults, the
// job's env, then what the RTE must decide itself (temp directory, plugin wiring). Nothing of
// the RTE's own environment is read here. Callbacks and callback paths that base enables are
// kept beside af_events.
func buildEnv(base []string, jobEnv map[string]string, pluginEnv []string, tmp string) []string {
	var e envList
	for _, kv := range base {
		if k, v, ok := splitEnv(kv); ok {
			e.set(k, v)
		}
	}
	baseCallbacks, baseCallbackPaths := e.vals["ANSIBLE_CALLBACKS_ENABLED"], e.vals["ANSIBLE_CALLBACK_PLUGINS"]
	for _, kv := range defaultEnv {
		e.set(kv[0], kv[1])
	}
	for _, k := range sortedKeys(jobEnv) {
		e.set(k, jobEnv[k])
	}
	e.set("ANSIBLE_LOCAL_TEMP", tmp)
	for _, kv := range pluginEnv {
		k, v, ok := splitEnv(kv)
		if !ok {
			continue
		}
		switch {
		case k == "ANSIBLE_CALLBACKS_ENABLED" && baseCallbacks != "":
			v += "," + baseCallbacks
		case k == "ANSIBLE_CALLBACK_PLUGINS" && baseCallbackPaths != "":
			v += string(os.PathListSeparator) + baseCallbackPaths
		}
		e.set(k, v)
	}
	return e.list()
}

// envList keeps the first position of each key and its last value.
type envList struct {
	keys []string
	vals map[string]string
}

func (e *envList) set(k, v string) {
	if e.vals == nil {
		e.vals = map[string]string{}
	}
	if _, ok := e.vals[k]; !ok {
		e.keys = append(e.keys, k)
	}
	e.vals[k] = v
}

func (e *envList) list() []string {
	out := make([]string, 0, len(e.keys))
	for _, k := range e.keys {
		out = append(out, k+"="+e.vals[k])
	}
	return out
}

func splitEnv(kv string) (string, string, bool) {
	k, v, ok := strings.Cut(kv, "=")
	return k, v, ok && k != ""
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// pluginEnv is the af_events wiring for a child whose events pipe is eventsFD.
func pluginEnv(pluginDir string) []string { return afevents.Env(pluginDir, eventsFD) }
