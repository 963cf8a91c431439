// Package display holds the few text helpers the reference app's output shares: OneLine makes
// text from a host or a client safe for one line of a terminal, a log or an answer; Plural and
// Duration word counts and times as the CLI and the admin page both show them.
//
// It owns presentation of single values only; it refuses layout (tables, pages, summaries stay
// with the CLI, the page and package summary) and never decides what is shown.
package display
