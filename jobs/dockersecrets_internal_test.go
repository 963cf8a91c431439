package jobs

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// The RTE's write of a secret never waits on a container that does not read it: one that has
// ended stops it at once, and a reader that comes gets the value and then EOF.
func TestWriteSecretFollowsTheContainer(t *testing.T) {
	dir := t.TempDir()
	p := private{dir: dir, secrets: map[string]string{"vault_password": "/run/rte-secrets/vault_password"},
		values: map[string]string{"vault_password": "pw-1"}}
	hs, err := makeSecretPipes(p)
	if err != nil || len(hs) != 1 || hs[0].pipe != filepath.Join(dir, "vault_password.pipe") || hs[0].file != "/run/rte-secrets/vault_password" {
		t.Fatalf("makeSecretPipes = %+v, %v", hs, err)
	}

	ended := &dockerRun{done: make(chan struct{})}
	close(ended.done)
	start := time.Now()
	if err := ended.writeSecret(hs[0], time.Now().Add(time.Minute)); !errors.Is(err, errContainerEnded) || time.Since(start) > 5*time.Second {
		t.Errorf("writeSecret to an ended container = %v after %s, want errContainerEnded at once", err, time.Since(start))
	}

	running := &dockerRun{done: make(chan struct{})}
	if err := running.writeSecret(hs[0], time.Now().Add(50*time.Millisecond)); err == nil || errors.Is(err, errContainerEnded) {
		t.Errorf("writeSecret with no reader past the deadline = %v, want a timeout", err)
	}

	got := make(chan string, 1)
	go func() {
		f, err := os.OpenFile(hs[0].pipe, os.O_RDONLY, 0) // blocks until the writer comes, as cat does
		if err != nil {
			got <- err.Error()
			return
		}
		defer f.Close()
		b, _ := io.ReadAll(f)
		got <- string(b)
	}()
	if err := running.writeSecret(hs[0], time.Now().Add(time.Minute)); err != nil {
		t.Fatalf("writeSecret with a reader: %v", err)
	}
	if v := <-got; v != "pw-1" {
		t.Errorf("the reader got %q, want pw-1", v)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(hs[0].pipe, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO || st.Mode&0o777 != 0o600 || st.Size != 0 {
		t.Errorf("the pipe: mode %o size %d, %v; want a 0600 fifo holding nothing", st.Mode, st.Size, err)
	}
}
