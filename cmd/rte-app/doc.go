// Command rte-app is the reference app: the app half of the RTE protocol as a runnable program.
// It is the demo, the peer in every end-to-end test, and the example for app authors.
//
//	rte-app serve      registration, the admin API and dispatch, with a SQLite store
//	rte-app runners    and the other CLI commands: talk to a running app over its admin API
//	rte-app demo       the app, a real RTE and a real playbook on one machine
//
// It owns wiring and presentation only: registration, approval, pinned dialling, dispatch and
// exactly-once storage are package app's, and this command never decides any of them. It does
// not serve a web page; docs/reference-app.md describes the API and the CLI.
package main
