#!/usr/bin/env bash
# Generates a client from openapi.json with three generators, with no edit to
# the document or to their output, and compiles each:
#   1. oapi-codegen (Go), then go build and go vet; the result must also be
#      byte for byte the committed examples/goclient/client.gen.go;
#   2. @hey-api/openapi-ts (a TypeScript SDK), then tsc --strict;
#   3. openapi-typescript with openapi-fetch, then tsc --strict.
# Each TypeScript client is also called by a few lines of code, so that its
# types are used, not only declared. Everything happens in a temporary
# directory. Needs Go, Node.js 20.19 or later and npm, with the Go module proxy
# and the npm registry reachable. Stops at the first failure, non-zero.
set -euo pipefail

OAPI_CODEGEN=v2.8.2     # github.com/oapi-codegen/oapi-codegen/v2, as in examples/goclient/generate.go
OAPI_RUNTIME=v1.8.0     # github.com/oapi-codegen/runtime, as in examples/go.mod
HEY_API=0.95.0          # @hey-api/openapi-ts: its last release that runs on Node.js 20
OPENAPI_TYPESCRIPT=7.13.0
OPENAPI_FETCH=0.17.0
TYPESCRIPT=5.9.3

root=$(cd "$(dirname "$0")/.." && pwd)
doc=$root/openapi.json
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== oapi-codegen $OAPI_CODEGEN: the Go client"
mkdir "$work/go"
cd "$work/go"
printf 'module check/goclient\n\ngo 1.26\n' >go.mod
go run "github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@$OAPI_CODEGEN" \
	-config "$root/examples/goclient/oapi-codegen.yaml" "$doc"
go get "github.com/oapi-codegen/runtime@$OAPI_RUNTIME"
go mod tidy
go build ./...
go vet ./...
if ! cmp -s client.gen.go "$root/examples/goclient/client.gen.go"; then
	echo "examples/goclient/client.gen.go is not what openapi.json generates: run 'go generate ./...' in examples/goclient" >&2
	exit 1
fi

echo "== npm install: @hey-api/openapi-ts@$HEY_API openapi-typescript@$OPENAPI_TYPESCRIPT openapi-fetch@$OPENAPI_FETCH typescript@$TYPESCRIPT"
mkdir "$work/ts"
cd "$work/ts"
printf '{"private": true, "type": "module"}\n' >package.json
npm install --no-audit --no-fund --save-exact --loglevel=error \
	"@hey-api/openapi-ts@$HEY_API" "openapi-typescript@$OPENAPI_TYPESCRIPT" \
	"openapi-fetch@$OPENAPI_FETCH" "typescript@$TYPESCRIPT"

echo "== @hey-api/openapi-ts: the SDK"
npx --no-install openapi-ts --input "$doc" --output hey --client @hey-api/client-fetch
cat >use-hey.ts <<'EOF'
import { client } from "./hey/client.gen";
import { createButton, deleteButton, getButton, listButtons, restoreButton, updateButton } from "./hey/sdk.gen";
import type { Button, WriteResult } from "./hey/types.gen";

client.setConfig({ baseUrl: "http://127.0.0.1:8080", headers: { "X-API-KEY": "pbk_example" } });

export async function lifecycle(): Promise<Button[]> {
  const created = await createButton({
    body: { productName: "Pro plan", amount: "19.90", currency: "usd", paymentMethod: "Stripe",
      paymentType: "one_time", isLive: false, metadata: { orderRef: "A-17" } },
  });
  const id: string = created.data?.data ?? "";
  const got = await getButton({ path: { id } });
  const version: number = got.data?.data.version ?? 1;
  await updateButton({ path: { id }, headers: { "If-Match": `"${version}"` }, body: { amount: "12.00", currency: "EUR" } });
  const deleted = await deleteButton({ path: { id }, headers: { "If-Match": "*" } });
  const done: WriteResult["message"] | undefined = deleted.data?.message;
  if (done === "deleted") await restoreButton({ path: { id } });
  // A create whose answer was lost: look for it among the newest buttons by its orderRef.
  const page = await listButtons({ query: { paymentMethod: "Stripe", isLive: false, state: "all", limit: 20 } });
  return (page.data?.data.items ?? []).filter((b) => b.metadata["orderRef"] === "A-17");
}
EOF

echo "== openapi-typescript: the types for openapi-fetch"
npx --no-install openapi-typescript "$doc" --output fetch/schema.d.ts
cat >use-fetch.ts <<'EOF'
import createClient from "openapi-fetch";
import type { components, paths } from "./fetch/schema";

const api = createClient<paths>({ baseUrl: "http://127.0.0.1:8080", headers: { "X-API-KEY": "pbk_example" } });

export async function lifecycle(): Promise<components["schemas"]["Button"][]> {
  const created = await api.POST("/product-payment/create", {
    body: { productName: "Pro plan", amount: "19.90", currency: "USD", paymentMethod: "the service",
      paymentType: "subscription", billingInterval: "Monthly", isLive: true },
  });
  const id: string = created.data?.data ?? "";
  const updated = await api.POST("/product-payment/update/{id}", {
    params: { path: { id }, header: { "If-Match": '"1"' } }, body: { description: null, metadata: { team: "web" } },
  });
  const etag: string = updated.response.headers.get("ETag") ?? "*";
  const deleted = await api.DELETE("/product-payment/delete/{id}", { params: { path: { id }, header: { "If-Match": etag } } });
  const code: components["schemas"]["ErrorCode"] | undefined = deleted.error?.code;
  // A delete sent again is wrong_state: the button is deleted either way.
  if (deleted.data?.message === "deleted" || code === "wrong_state") {
    await api.POST("/product-payment/restore/{id}", { params: { path: { id } } });
  }
  const got = await api.GET("/product-payment/get/{id}", { params: { path: { id } } });
  const page = await api.GET("/product-payment/list", {
    params: { query: { paymentMethod: got.data?.data.paymentMethod, isLive: true, state: "all", limit: 2 } },
  });
  return page.data?.data.items ?? [];
}
EOF

echo "== tsc --strict"
cat >tsconfig.json <<'EOF'
{
  "compilerOptions": {
    "strict": true,
    "noEmit": true,
    "target": "ES2022",
    "module": "ESNext",
    "moduleResolution": "Bundler",
    "lib": ["ES2022", "DOM", "DOM.Iterable"],
    "skipLibCheck": false
  },
  "include": ["hey", "fetch", "use-hey.ts", "use-fetch.ts"]
}
EOF
npx --no-install tsc --project tsconfig.json --strict

echo "all three clients compile"
