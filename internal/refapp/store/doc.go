// Package store chooses and opens the reference app's store from APP_DB: a PostgreSQL database
// for a postgres:// URL (app nodes on several hosts share it), an SQLite file otherwise (nodes
// on one host only). It also gives APP_DB as it may be logged, without a password.
//
// It owns the choice only: the stores themselves, their schema and exactly-once storage are
// app/sqlitestore's and app/pgstore's, and this package adds no behaviour on top of them.
package store
