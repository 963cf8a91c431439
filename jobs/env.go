package jobs

import (
	"fmt"
	"slices"
	"strings"
)

// neverPassed are the RTE's own secrets: no RTE_JOB_ENV_ALLOW entry lets them into a job,
// so a pattern such as RTE_* cannot hand a playbook the token that opens its secrets.
var neverPassed = []string{"RTE_TOKEN", "RTE_JOIN_TOKEN", "METRICS_TOKEN", "HTTPS_PROXY", "https_proxy"}

// envAllowed reports whether name matches one of allow's entries: a name, or a prefix
// followed by "*".
func envAllowed(name string, allow []string) bool {
	for _, a := range allow {
		if p, ok := strings.CutSuffix(a, "*"); ok {
			if strings.HasPrefix(name, p) {
				return true
			}
		} else if a == name {
			return true
		}
	}
	return false
}

// PassEnv is the part of environ ("K=V" strings) a job starts from: the variables allow
// (RTE_JOB_ENV_ALLOW) names, never the RTE's own tokens.
func PassEnv(environ, allow []string) []string {
	var out []string
	for _, kv := range environ {
		k, _, ok := splitEnv(kv)
		if ok && envAllowed(k, allow) && !slices.Contains(neverPassed, k) {
			out = append(out, kv)
		}
	}
	return out
}

// Names in a job's env that change where ansible writes, which code and plugins it loads or
// which configuration and files it reads. The app may not set them unless the operator lists
// the exact name in RTE_JOB_ENV_ALLOW: each one either moves output out of the masked record
// stream (ANSIBLE_LOG_PATH wrote an unmasked copy of every line), or points ansible at files
// on the RTE the app did not send.
var (
	guardedNames = map[string]string{
		"ANSIBLE_CONFIG":                  "chooses the configuration file ansible reads",
		"ANSIBLE_HOME":                    "moves ansible's own directory (plugins, collections, temp files)",
		"ANSIBLE_LIBRARY":                 "chooses where modules are loaded from",
		"ANSIBLE_MODULE_UTILS":            "chooses where module code is loaded from",
		"ANSIBLE_INVENTORY":               "names inventory files on the RTE",
		"ANSIBLE_INVENTORY_ENABLED":       "chooses inventory plugins",
		"ANSIBLE_STDOUT_CALLBACK":         "replaces the plugin that writes the job's output",
		"ANSIBLE_LOAD_CALLBACK_PLUGINS":   "loads callback plugins",
		"ANSIBLE_CACHE_PLUGIN":            "chooses the fact cache plugin, which writes files",
		"ANSIBLE_CACHE_PLUGIN_CONNECTION": "chooses where the fact cache writes",
		"ANSIBLE_KEEP_REMOTE_FILES":       "keeps module files, secrets included, in temp directories",
		"ANSIBLE_RETRY_FILES_ENABLED":     "writes .retry files next to the playbooks",
		"ANSIBLE_VAULT_IDENTITY_LIST":     "names vault password files on the RTE",
		"ANSIBLE_VARS_ENABLED":            "chooses vars plugins",
		"ANSIBLE_DEBUG":                   "prints ansible's internals, secrets included, into the output",
		"ANSIBLE_PERSISTENT_LOG_MESSAGES": "logs module arguments, secrets included",
		"PYTHONPATH":                      "chooses where Python loads code from",
		"PYTHONHOME":                      "chooses the Python installation",
		"PYTHONSTARTUP":                   "runs a file on the RTE",
		"PYTHONUSERBASE":                  "chooses where Python loads user packages from",
		"PYTHONSAFEPATH":                  "changes where Python loads code from",
		"PYTHONINSPECT":                   "keeps Python waiting for input after the run",
		"BASH_ENV":                        "runs a file on the RTE in every shell",
		"ENV":                             "runs a file on the RTE in every shell",
	}
	// guardedSuffixes catch the families: ANSIBLE_ACTION_PLUGINS, ANSIBLE_ROLES_PATH,
	// ANSIBLE_COLLECTIONS_PATHS, ANSIBLE_LOG_PATH, ANSIBLE_SSH_CONTROL_PATH_DIR,
	// ANSIBLE_VAULT_PASSWORD_FILE, ANSIBLE_REMOTE_TEMP, ...
	guardedSuffixes = []struct{ suffix, why string }{
		{"_PLUGINS", "chooses where plugins are loaded from"},
		{"_PATH", "names a path on the RTE that ansible reads or writes"},
		{"_PATHS", "names paths on the RTE that ansible reads"},
		{"_DIR", "names a directory on the RTE that ansible writes"},
		{"_FILE", "names a file on the RTE that ansible reads"},
		{"_TEMP", "moves ansible's temp files"},
		{"_TMP", "moves ansible's temp files"},
	}
)

// guardedEnv says why the app may not set name without the operator's leave, or "" when it may.
func guardedEnv(name string) string {
	if why, ok := guardedNames[name]; ok {
		return why
	}
	if strings.HasPrefix(name, "LD_") {
		return "changes what the dynamic linker loads"
	}
	if rest, ok := strings.CutPrefix(name, "ANSIBLE_"); ok {
		for _, g := range guardedSuffixes {
			if strings.HasSuffix(rest, g.suffix) {
				return g.why
			}
		}
	}
	return ""
}

// checkEnv refuses job env keys that would override what the RTE sets itself (the af_events
// wiring, the job's temp directory), or that are guarded and not named exactly in allow
// (RTE_JOB_ENV_ALLOW), and values with a NUL byte. That each key is a plain variable name is
// protocol.JobStart.Validate's rule (protocol.ValidEnvName), checked before this.
func checkEnv(env map[string]string, reserved, allow []string) error {
	for _, k := range sortedKeys(env) {
		if slices.Contains(reserved, k) {
			return fmt.Errorf("env.%s: the RTE sets this itself (events plugin or job temp directory); remove it from the job", k)
		}
		if why := guardedEnv(k); why != "" && !slices.Contains(allow, k) {
			return fmt.Errorf("env.%s: refused because it %s; remove it from the job, or ask the RTE's operator to list %s in RTE_JOB_ENV_ALLOW", k, why, k)
		}
		if strings.ContainsRune(env[k], 0) {
			return fmt.Errorf("env.%s: value contains a NUL byte", k)
		}
	}
	return nil
}
