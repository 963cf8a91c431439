package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// standIn writes an ansible-playbook stand-in into dir/bin and returns that directory, for the
// sections that measure the RTE and the app rather than ansible (ansible-playbook prints well
// under 1 MB/s and a few hundred events a second). It answers --version as Debian's
// ansible-core does and otherwise, by the job's environment:
//
//	BENCH_SLEEP=S   sleeps S seconds (the scale section's idle jobs);
//	BENCH_EVENTS=F  copies F, lines of ansible-runner-shaped events, to the af_events
//	                descriptor the RTE passes in AF_EVENTS_FD, as fast as the pipe takes them;
//	BENCH_BYTES=N   prints N bytes of 100-byte lines as fast as the pipe takes them.
func standIn(dir string) (string, error) {
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o700); err != nil {
		return "", err
	}
	script := `#!/bin/sh
if [ "$1" = "--version" ]; then echo "ansible-playbook [core 2.14.18]"; exit 0; fi
if [ -n "$BENCH_SLEEP" ]; then exec sleep "$BENCH_SLEEP"; fi
if [ -n "$BENCH_EVENTS" ]; then
	case "$AF_EVENTS_FD" in ''|*[!0-9]*) echo "AF_EVENTS_FD is not a descriptor number: $AF_EVENTS_FD" >&2; exit 2;; esac
	eval "exec cat \"\$BENCH_EVENTS\" >&$AF_EVENTS_FD"
fi
yes "$(printf '%099d' 7)" | head -c "$BENCH_BYTES"
`
	return bin, os.WriteFile(filepath.Join(bin, "ansible-playbook"), []byte(script), 0o755)
}

// standInPlaybook lays out the files a stand-in job names (the RTE checks that they exist) and
// returns the playbook and inventory directories.
func standInPlaybook(dir string) (string, string, error) {
	pb, inv := filepath.Join(dir, "playbooks"), filepath.Join(dir, "inventory")
	for path, body := range map[string]string{
		filepath.Join(pb, "standin.yml"): "- hosts: all\n  tasks: []\n",
		filepath.Join(inv, "local.ini"):  "localhost ansible_connection=local\n",
	} {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return "", "", err
		}
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			return "", "", err
		}
	}
	return pb, inv, nil
}

// writeEvents writes n event lines shaped as af_events writes them (ansible-runner's fields:
// a runner_on_ok per host and task, about 700 bytes each) to path.
func writeEvents(path string, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var b strings.Builder
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const play = "0242ac11-0002-9ad1-7d6b-000000000001"
	for i := 1; i <= n; i++ {
		host := fmt.Sprintf("h%d", i%5+1)
		ts := created.Add(time.Duration(i) * time.Millisecond).Format("2006-01-02T15:04:05.000000Z")
		fmt.Fprintf(&b, `{"event":"runner_on_ok","uuid":"0242ac11-0002-9ad1-7d6b-%012d","parent_uuid":"%s","counter":%d,"created":"%s",`+
			`"event_data":{"playbook":"tasks.yml","playbook_uuid":"0242ac11-0002-9ad1-7d6b-000000000000","play":"all","play_uuid":"%s",`+
			`"play_pattern":"all","task":"debug","task_uuid":"0242ac11-0002-9ad1-7d6b-%012d","task_action":"debug","task_args":"",`+
			`"task_path":"/work/playbooks/tasks.yml:%d","host":"%s","remote_addr":"%s","res":{"msg":"task %d on %s","_ansible_verbose_always":true,"_ansible_no_log":false,"changed":false},`+
			`"start":"%s","end":"%s","duration":0.004,"event_loop":null,"uuid":"0242ac11-0002-9ad1-7d6b-%012d"},`+
			`"stdout":"ok: [%s] => {\n    \"msg\": \"task %d on %s\"\n}","start_line":%d,"end_line":%d,"runner_ident":"bench","pid":4242}`+"\n",
			i, play, i, ts, play, i, i, host, host, i, host, ts, ts, i, host, i, host, 3*i, 3*i+3)
		if b.Len() > 1<<20 {
			if _, err := f.WriteString(b.String()); err != nil {
				return err
			}
			b.Reset()
		}
	}
	if _, err := f.WriteString(b.String()); err != nil {
		return err
	}
	return f.Close()
}
