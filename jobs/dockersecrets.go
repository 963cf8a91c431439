package jobs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// A job container's secrets never touch the RTE's disk: the container's shell (runScript)
// reads each from a named pipe in the job's private directory into its file on the
// secretMount tmpfs, and the RTE writes the value into the pipe from memory once the shell has
// opened it. A pipe holds no data on disk, and nothing of the value is in the container's
// environment, labels or command line.

// secretHandoff is one secret on its way into the job's container: the pipe the container's
// shell reads, the file on the tmpfs it writes, and the value.
type secretHandoff struct {
	pipe, file, value string
}

// secretHandoffWait bounds how long a started container may take to open its secret pipes
// (the image's shell starting): past it the RTE gives up and kills the container.
const secretHandoffWait = 2 * time.Minute

// secretPoll is how often the RTE looks whether the container's shell has opened a pipe.
const secretPoll = 10 * time.Millisecond

// makeSecretPipes makes one pipe per secret the engine hands over, in the order runScript
// reads them.
func makeSecretPipes(p private) ([]secretHandoff, error) {
	var out []secretHandoff
	for _, name := range sortedKeys(p.values) {
		pipe := filepath.Join(p.dir, name+".pipe")
		if err := unix.Mkfifo(pipe, 0o600); err != nil {
			return nil, fmt.Errorf("make the pipe %s: %v", pipe, err)
		}
		out = append(out, secretHandoff{pipe: pipe, file: p.secrets[name], value: p.values[name]})
	}
	return out, nil
}

// handOverSecrets writes each secret into its pipe. A container that cannot take them (it
// ended first, or never opened a pipe within secretHandoffWait) never blocks the RTE: a
// container still running then is killed, as ansible-playbook would lack its secrets.
func (c *dockerRun) handOverSecrets(hs []secretHandoff) {
	deadline := time.Now().Add(secretHandoffWait)
	for _, h := range hs {
		err := c.writeSecret(h, deadline)
		if errors.Is(err, errContainerEnded) {
			return
		}
		if err != nil {
			c.d.log.Error("could not hand the job's secrets to its container; killing it", zap.String("container", shortID(c.id)), zap.Error(err))
			c.kill("SIGKILL")
			return
		}
	}
}

var errContainerEnded = errors.New("the container ended")

// writeSecret waits for a reader on h.pipe (opening a pipe's write end without blocking fails
// with ENXIO while nobody reads it), writes the value and closes the pipe, which ends the
// reader's copy.
func (c *dockerRun) writeSecret(h secretHandoff, deadline time.Time) error {
	tick := time.NewTicker(secretPoll)
	defer tick.Stop()
	for {
		f, err := os.OpenFile(h.pipe, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err == nil {
			_ = f.SetWriteDeadline(deadline)
			_, err = f.Write([]byte(h.value))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("write %s: %v", h.pipe, err)
			}
			return nil
		}
		if !errors.Is(err, syscall.ENXIO) {
			return fmt.Errorf("open %s: %v", h.pipe, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the container did not open %s within %s", h.pipe, secretHandoffWait)
		}
		select {
		case <-c.done:
			return errContainerEnded
		case <-tick.C:
		}
	}
}
