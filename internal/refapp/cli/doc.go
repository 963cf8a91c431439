// Package cli is rte-app's command line: the commands that talk to a running app over its
// admin API (runners, approve, reject, clear-waiting, run, follow, jobs, cancel, check), the
// flag sets and -h/--help of every command, and the exit statuses (docs/reference-app.md has
// the table). run and follow stream a job's output, reconnect after an outage without losing
// a record, and print the play summary at the end.
//
// It is a client only: it never opens the store or decides anything the app decides; it warns
// before sending job secrets over plain HTTP to anything but loopback. Text from the app and
// the hosts is made safe for one terminal line before it is printed.
package cli
