package jobs_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rte-project/rte/protocol"
)

// A job container's secret reaches ansible-playbook as a 0600 file on the container's tmpfs,
// and is at no moment of the run in the job directory on the RTE's disk: the test scans every
// file there while the playbook waits for it.
func TestDockerSecretsOnlyOnTheContainersTmpfs(t *testing.T) {
	eachEngine(t, func(t *testing.T, en testEngine) {
		const vaultPW = "vault-pw-tmpfs-only-4d2a"
		e, _ := newEngineEnv(t, en, "docker-test-secretfile", nil)
		js := jobStart("dsecretfile-1", "secretfile.yml")
		js.Secrets = map[string]string{"vault_password": seal(t, "dsecretfile-1", vaultPW)}
		e.start(t, js)
		sum := sha256.Sum256([]byte(vaultPW))
		want := fmt.Sprintf("sha=%s len=%d mode=600", hex.EncodeToString(sum[:]), len(vaultPW))
		e.rec.waitFor(t, "dsecretfile-1", "the secret file described", func(r []protocol.Record) bool {
			return strings.Contains(outputText(t, r), "sha=")
		})

		dir := filepath.Join(e.work, "dsecretfile-1")
		var files int
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.Name() == "vault_password" {
				t.Errorf("%s is on the RTE's disk", path)
			}
			if !d.Type().IsRegular() {
				return nil // the pipes among them: reading one would wait for a writer
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			files++
			if strings.Contains(string(b), vaultPW) {
				t.Errorf("%s holds the secret", path)
			}
			return nil
		})
		if err != nil || files == 0 {
			t.Errorf("scan the job directory: %v, %d files", err, files)
		}
		if err := os.WriteFile(filepath.Join(dir, "playbooks", "scanned"), nil, 0o644); err != nil {
			t.Fatal(err)
		}

		recs := e.rec.waitEnd(t, "dsecretfile-1")
		wantEnd(t, recs, protocol.StatusSuccess, 0)
		out := outputText(t, recs)
		if !strings.Contains(out, want) || !strings.Contains(out, "content=********") {
			t.Errorf("output lacks %q or the masked content; output:\n%s", want, out)
		}
		var note bool
		for _, r := range recs {
			if strings.Contains(string(r.Data), vaultPW) {
				t.Errorf("record %d (%s) holds the secret", r.Seq, r.Kind)
			}
			note = note || r.Kind == protocol.KindLog && strings.Contains(string(r.Data), "tmpfs /run/rte-secrets")
		}
		if !note {
			t.Error("no log record says where the secret is")
		}
	})
}
