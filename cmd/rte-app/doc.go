// Command rte-app is the reference app: the app half of the RTE protocol as a runnable program.
// It is the demo, the peer in every end-to-end test, and the example for app authors.
//
//	rte-app serve      registration, the admin API, the admin page and dispatch, with a SQLite store
//	rte-app runners    and the other CLI commands: talk to a running app over its admin API
//	rte-app demo       the app, a real RTE and a real playbook on one machine
//
// It owns wiring and presentation only: registration, approval, pinned dialling, dispatch and
// exactly-once storage are package app's, and this command never decides any of them. Its admin
// page (web*.go, templates and assets embedded from web/) is a thin layer over the same
// handlers as the admin API. docs/reference-app.md describes the API and the CLI,
// docs/admin-page.md the page.
package main
