#!/usr/bin/env bash
# Generates three clients from openapi.json in a temporary directory, with no edit to the document
# or to their output, and compiles each with a few lines that use its types: oapi-codegen (Go: go
# build, go vet); @hey-api/openapi-ts, and openapi-typescript with openapi-fetch (TypeScript: tsc
# --strict). Without Node.js and npm, the TypeScript part is skipped, saying so.
set -euo pipefail
doc=$(cd "$(dirname "$0")/.." && pwd)/openapi.json
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mkdir "$work/go" && cd "$work/go"
printf 'module check/client\n\ngo 1.26\n' >go.mod
go run github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@v2.8.2 \
	-generate types,client -package client -o client.gen.go "$doc"
cat >use.go <<'EOF'
package client

import "context"

// create makes a monthly StripeConnect button, and returns its id and ETag.
func create(ctx context.Context, api *ClientWithResponses) (string, string, error) {
	month, fee := Month, FeeInput("2.50")
	created, err := api.CreateButtonWithResponse(ctx, CreateButtonRequest{ProductName: "Pro plan",
		Amount: "19.90", Currency: "USD", PaymentMethod: StripeConnect, PaymentType: Subscription,
		BillingInterval: &month, ApplicationFeePercentage: &fee})
	if err != nil || created.JSON200 == nil {
		return "", "", err
	}
	return created.JSON200.Data, created.Headers200.ETag, nil
}
EOF
go get github.com/oapi-codegen/runtime@v1.8.0
go mod tidy
go build ./...
go vet ./...
echo "oapi-codegen: the Go client compiles"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	echo "skipped: the TypeScript clients need Node.js and npm"
	exit 0
fi
mkdir "$work/ts" && cd "$work/ts"
echo '{"private": true, "type": "module"}' >package.json
npm install --no-audit --no-fund --loglevel=error @hey-api/openapi-ts@0.95.0 \
	openapi-typescript@7.13.0 openapi-fetch@0.17.0 typescript@5.9.3
npx --no-install openapi-ts --input "$doc" --output hey --client @hey-api/client-fetch
npx --no-install openapi-typescript "$doc" --output fetch/schema.d.ts
cat >use-hey.ts <<'EOF'
import { client } from "./hey/client.gen";
import { createButton, listButtons } from "./hey/sdk.gen";
import type { Button } from "./hey/types.gen";

// Creates the button of orderRef, unless a create whose answer was lost already did.
export async function ensure(key: string, orderRef: string): Promise<string> {
  client.setConfig({ baseUrl: "http://localhost:8080", headers: { "X-API-KEY": key } });
  const page = await listButtons({ query: { limit: 20 } });
  const done = page.data?.data.items.find((b: Button) => b.metadata["orderRef"] === orderRef);
  if (done) return done.id;
  const created = await createButton({ body: { productName: "Pro plan", amount: "19.90",
    currency: "USD", paymentMethod: "the service", paymentType: "subscription",
    billingInterval: "month", isLive: false, metadata: { orderRef } } });
  return created.data?.data ?? created.error?.code ?? "";
}
EOF
cat >use-fetch.ts <<'EOF'
import createClient from "openapi-fetch";
import type { components, paths } from "./fetch/schema";

type ErrorCode = components["schemas"]["ErrorCode"];

// Deletes a button at the version it was read at; returns why not when that is refused.
export async function remove(key: string, id: string): Promise<ErrorCode | null> {
  const api = createClient<paths>({ baseUrl: "http://localhost:8080",
    headers: { "X-API-KEY": key } });
  const got = await api.GET("/product-payment/get/{id}", { params: { path: { id } } });
  const deleted = await api.DELETE("/product-payment/delete/{id}",
    { params: { path: { id }, header: { "If-Match": got.response.headers.get("ETag") ?? "*" } } });
  return deleted.error?.code ?? null;
}
EOF
echo '{"include": ["hey", "fetch", "*.ts"], "compilerOptions": {"strict": true, "noEmit": true,
  "target": "ES2022", "module": "ESNext", "moduleResolution": "Bundler",
  "lib": ["ES2022", "DOM", "DOM.Iterable"]}}' >tsconfig.json
npx --no-install tsc --project tsconfig.json
echo "@hey-api/openapi-ts and openapi-typescript: the TypeScript clients compile"
