package api

// Names the external tests (package api_test) need: they cannot be internal tests, because
// the test app they start (refapptest) imports this package through package server.
var ParseCheckRequest = parseCheckRequest

const (
	CheckSchemaName = checkSchemaName
	MaxCheckBody    = maxCheckBody
)

var (
	CheckSchemaJSON = checkSchemaJSON
	CheckSchema     = checkSchema
)
