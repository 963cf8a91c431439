package jobs

import (
	"context"
	"errors"
	"fmt"

	"github.com/rte-project/rte/protocol"
)

// endOf decides a started job's end from how its process ended and why it was stopped.
func (r *runner) endOf(st exitStatus, waitErr error, signaled bool) protocol.EndData {
	end := r.decideEnd(st, waitErr, signaled)
	if st.note != "" && end.Status == protocol.StatusFailed {
		end.Message += " (" + st.note + ")"
	}
	return end
}

func (r *runner) decideEnd(st exitStatus, waitErr error, signaled bool) protocol.EndData {
	r.settle(len(r.unsynced))
	code := st.code
	if r.spoolErr != nil {
		return protocol.EndData{Status: protocol.StatusError, ExitCode: code, Message: fmt.Sprintf(
			"spool failed (%v); the job was stopped and its records after that point are lost: check the spool volume's free space and health", r.spoolErr)}
	}
	if signaled {
		return causeEnd(context.Cause(r.j.ctx), code, r.j.js.TimeoutS)
	}
	if !st.known {
		return protocol.EndData{Status: protocol.StatusError, ExitCode: code, Message: fmt.Sprintf("wait for ansible-playbook: %v", waitErr)}
	}
	if code == 0 {
		return protocol.EndData{Status: protocol.StatusSuccess, ExitCode: 0, Message: "ansible-playbook exited 0"}
	}
	if st.signal != 0 {
		return protocol.EndData{Status: protocol.StatusFailed, ExitCode: code, Message: fmt.Sprintf(
			"ansible-playbook was killed by signal %d (%v), not by the RTE", int(st.signal), st.signal)}
	}
	return protocol.EndData{Status: protocol.StatusFailed, ExitCode: code, Message: fmt.Sprintf("ansible-playbook exited %d: %s", code, exitMeaning(code))}
}

// causeEnd is the end of a job the RTE stopped.
func causeEnd(cause error, code, timeoutS int) protocol.EndData {
	switch {
	case errors.Is(cause, errCanceled):
		return protocol.EndData{Status: protocol.StatusCanceled, ExitCode: code, Message: "canceled by the app (job.cancel)"}
	case errors.Is(cause, errTimeout):
		return protocol.EndData{Status: protocol.StatusTimeout, ExitCode: code, Message: fmt.Sprintf("ran longer than timeout_s (%d s) and was stopped", timeoutS)}
	case errors.Is(cause, errAbandoned):
		return protocol.EndData{Status: protocol.StatusAbandoned, ExitCode: code, Message: "the RTE was draining and RTE_DRAIN_SECONDS ran out; the job was stopped"}
	case cause == nil:
		return protocol.EndData{Status: protocol.StatusError, ExitCode: code, Message: "stopped for no recorded reason"}
	}
	return protocol.EndData{Status: protocol.StatusError, ExitCode: code, Message: cause.Error()}
}

// Exit statuses of ansible-core 2.14 (lib/ansible/cli/__init__.py and TaskQueueManager).
var exitMeanings = map[int]string{
	1:   "ansible reported an error (see the output)",
	2:   "one or more hosts failed",
	3:   "one or more hosts were unreachable",
	4:   "one or more hosts were unreachable, or the playbook could not be parsed",
	5:   "bad or incomplete command line options",
	6:   "command line arguments are not UTF-8",
	99:  "ansible-playbook was interrupted",
	250: "an unexpected error inside ansible (see the traceback in the output)",
	255: "an unknown error inside ansible",
}

func exitMeaning(code int) string {
	if s, ok := exitMeanings[code]; ok {
		return s
	}
	return "see the output"
}

func errorEnd(format string, args ...any) protocol.EndData {
	return protocol.EndData{Status: protocol.StatusError, ExitCode: -1, Message: fmt.Sprintf(format, args...)}
}
