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
import { createButton, getButtonHistory, listButtons, updateButton } from "./hey/sdk.gen";
import type { Button } from "./hey/types.gen";

client.setConfig({ baseUrl: "http://127.0.0.1:8080", headers: { "X-API-KEY": "pbk_example" } });

export async function lifecycle(): Promise<Button[]> {
  const created = await createButton({
    body: { productName: "Pro plan", amount: "19.90", currency: "usd", paymentMethod: "Stripe",
      paymentType: "one_time", isLive: false, metadata: { orderRef: "A-17" } },
  });
  const id: string = created.data?.data ?? "";
  await updateButton({ path: { id }, headers: { "If-Match": '"1"' }, body: { amount: "12.00", metadata: { orderRef: null } } });
  const history = await getButtonHistory({ path: { id }, query: { limit: 2 } });
  const next: number | null | undefined = history.data?.data.next;
  const page = await listButtons({
    query: { paymentMethod: "Stripe", isLive: false, state: "all", after: next === null ? undefined : id },
  });
  return page.data?.data.items ?? [];
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
  await api.POST("/product-payment/update/{id}", {
    params: { path: { id }, header: { "If-Match": '"1"' } }, body: { description: null, metadata: { team: "web" } },
  });
  const history = await api.GET("/product-payment/history/{id}", { params: { path: { id }, query: { after: 0, limit: 2 } } });
  const last: number = history.data?.data.next ?? 0;
  const page = await api.GET("/product-payment/list", {
    params: { query: { paymentMethod: "the service", isLive: true, state: "all", limit: last > 0 ? 2 : 20 } },
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
