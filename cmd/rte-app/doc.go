// Command rte-app is the reference app: the app half of the RTE protocol as a runnable program.
// It is the demo, the peer in every end-to-end test, and the example for app authors.
//
//	rte-app serve      registration, the admin API, the admin page and dispatch, with a SQLite store
//	rte-app runners    and the other CLI commands: talk to a running app over its admin API
//	rte-app demo       the app, a real RTE and a real playbook on one machine
//
// It only wires: it dispatches the subcommand, reads the settings (internal/refapp/settings),
// builds the logger (internal/logging) and runs the packages under internal/refapp (server,
// api, web, cli, demo). Registration, approval, pinned dialling, dispatch and exactly-once
// storage are package app's. docs/reference-app.md describes the API and the CLI,
// docs/admin-page.md the page.
package main
