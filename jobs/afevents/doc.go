// Package afevents owns af_events, the Ansible callback plugin that turns a playbook run into
// structured events, and the Go side of its small contract: where the plugin is installed, the
// environment that enables it, and the shape of one event line.
//
// The plugin (af_events.py, embedded here) writes one line of compact JSON per Ansible event to
// the file descriptor named by AF_EVENTS_FD, never to stdout, so ansible's own output is
// unchanged. Event names and event_data fields follow ansible-runner's, so UIs written for
// ansible-runner or AWX can read them. Per line the plugin guarantees:
//
//   - counter is 1, 2, 3... in write order, with no gaps, for one ansible-playbook process;
//   - parent_uuid links a runner_* event to its task's start event, a task start to its play
//     start, and a play start to playbook_on_start;
//   - a result of a no_log task, or a no_log loop item anywhere inside a result, holds only
//     {"censored": Censored}; a censored loop item event has "item": null;
//   - a payload value (res, item, diff, ...) whose JSON is over MaxResBytes is replaced by
//     {"_af_truncated": true, "original_bytes": N, "preview": "<first PreviewBytes of the JSON>"};
//   - no line is longer than MaxLineBytes, newline included;
//   - values JSON cannot hold are converted: bytes and undecodable text to UTF-8 with U+FFFD,
//     sets and tuples to arrays, dates to ISO 8601, NaN and infinities to null, vaulted strings
//     to {"__ansible_vault": ciphertext} (never decrypted);
//   - stdout is the text ansible displayed since the previous event (the stdout callback runs
//     just before the plugin for the same call), cut to MaxResBytes; [start_line, end_line) is
//     its line range, so in counter order the events' stdout is ansible's output from the first
//     line displayed after the plugin loaded (the plugin wraps the shared Display and notes
//     each text under the display's lock, in the order it is written); runner_ident is
//     AF_JOB_ID and pid ansible-playbook's;
//   - an error inside the plugin never fails the playbook: it becomes a "warning" event whose
//     event_data has "source": "af_events". If the channel breaks (the reader closed it), the
//     plugin stops writing and the playbook goes on; the last line may then be cut short.
//
// The plugin does not censor anything but no_log results: replacing known secret values in
// event lines is the job runner's work, as it is for stdout. This package does not read the
// pipe, batch events or spool them; it starts no goroutines.
package afevents
