// Package api is the reference app's admin JSON API under /api/v2/, behind APP_ADMIN_TOKEN:
// runners (list, approve with the certificate the admin compared, reject, clear the waiting
// ones, connection checks), jobs (submit, list, get, records, the live event stream, cancel),
// and the wire types the CLI and the page read. docs/reference-app.md describes every route.
//
// It owns the HTTP shape only: registration, approval, pinned dialling, dispatch and
// exactly-once storage are package app's, and the API never decides any of them; a refusal of
// app's becomes a status and a message naming the field. It refuses any request without the
// admin token, bodies over their bound, and JSON with unknown fields. It does not mount the
// protocol's registration endpoint or the admin page: package server puts them beside it.
package api
