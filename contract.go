package dbcloud

import _ "embed"

// OpenAPI is the API contract, served at /public/api/v1/openapi.yaml. Tests
// check every route and response against it, so code and contract cannot drift.
//
//go:embed openapi.yaml
var OpenAPI []byte
