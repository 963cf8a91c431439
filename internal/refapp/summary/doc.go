// Package summary builds the play summary of a job, the "Hosts and tasks" view, from the
// af_events events ansible-playbook wrote: plays, tasks, one row per host with its result, the
// recap and the warnings; and writes it as text for a terminal. The CLI prints it after a
// followed job, the admin page draws it beside the output.
//
// The events come from the hosts a playbook touched, so it trusts none of them: bad, missing
// or shuffled events are counted, not fatal, and every piece of text is made safe for one
// line and bounded. It refuses to read or store records itself: callers hand it the events.
package summary
