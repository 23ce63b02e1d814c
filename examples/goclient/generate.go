// Package goclient is the Go client that oapi-codegen generates from the
// service's openapi.json, used by this directory's lifecycle test against a
// real server. Regenerate it after changing the document: go generate ./...
package goclient

//go:generate go run github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@v2.8.2 -config oapi-codegen.yaml ../../openapi.json
