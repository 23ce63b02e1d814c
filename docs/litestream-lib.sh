# shellcheck shell=bash
# Shared by the docs/litestream-*.sh scripts; not run alone.
# Needs bash, curl, awk and the usual coreutils; Go only when a binary must be built.
#
# Sets: REPO, TMP (removed on exit), PB (paybuttons binary), LS (litestream binary),
# CONFIG (the Litestream configuration: the repository's litestream.yml).
# Every server it starts listens on 127.0.0.1 with a port the kernel picks.

LITESTREAM_VERSION=v0.5.18
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CONFIG=$REPO/litestream.yml
TMP=$(mktemp -d "${TMPDIR:-/tmp}/paybuttons-litestream.XXXXXX")
STARTED=() # pids to kill if the script stops early

cleanup() {
	local pid
	for pid in "${STARTED[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$TMP"
}
trap cleanup EXIT

# say TEXT: prints TEXT with the temporary directory shown as $TMP.
say() {
	local text="$*"
	printf '%s\n' "${text//$TMP/\$TMP}"
}
# load: the machine's load averages (1, 5, 15 min) and its cores, to read figures by.
load() { echo "load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"; }

# indent: say each line of the standard input, indented.
indent() {
	local line
	while IFS= read -r line; do say "  $line"; done
}
die() {
	printf 'FAILED: %s\n' "$*" >&2
	exit 1
}

# The binaries: $PAYBUTTONS and $LITESTREAM when set, else paybuttons built from
# this checkout and litestream from PATH, else installed into $TMP with go install.
find_binaries() {
	PB=${PAYBUTTONS:-}
	if [ -z "$PB" ]; then
		PB=$TMP/bin/paybuttons
		(cd "$REPO" && CGO_ENABLED=0 go build -o "$PB" .) || die "cannot build paybuttons"
	fi
	LS=${LITESTREAM:-$(command -v litestream || true)}
	if [ -z "$LS" ]; then
		say "litestream is not installed: installing $LITESTREAM_VERSION into the temporary directory (a minute or two)"
		GOBIN=$TMP/bin go install "github.com/benbjohnson/litestream/cmd/litestream@$LITESTREAM_VERSION" ||
			die "cannot install litestream"
		LS=$TMP/bin/litestream
	fi
	local v
	v=$("$LS" version)
	[ "$v" = "$LITESTREAM_VERSION" ] || say "note: litestream is $v; these scripts were measured with $LITESTREAM_VERSION"
}

# use_site DIR: the environment litestream.yml and paybuttons read, for a "host"
# whose database lives in DIR and whose replica is the directory $TMP/replica.
use_site() {
	mkdir -p "$1"
	export PAYBUTTONS_DB=$1/paybuttons.db
	export LITESTREAM_REPLICA_URL=file://$TMP/replica
}

# wait_log FILE PATTERN: wait up to 20 s for an extended regexp in FILE.
wait_log() {
	local _
	for _ in $(seq 200); do
		grep -Eq "$2" "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	cat "$1" >&2
	die "no '$2' in $1 after 20 s"
}

# port_of LOG: the port a paybuttons server logged it listens on.
port_of() {
	wait_log "$1" 'msg=listening url=http://127\.0\.0\.1:[0-9]+'
	grep -Eo 'msg=listening url=http://127\.0\.0\.1:[0-9]+' "$1" | tail -1 | grep -Eo '[0-9]+$'
}

# start_primary LOG: the command line of deploy/paybuttons.service for the site in
# use: litestream, and paybuttons as its child 2 s later. Sets LS_PID, PB_PID, PORT.
start_primary() {
	: >"$1" # empty now: port_of must not read a previous server's line
	"$LS" replicate -config "$CONFIG" \
		-exec "/bin/sh -c 'sleep 2 && exec $PB serve -addr 127.0.0.1:0'" >"$1" 2>&1 &
	LS_PID=$!
	STARTED+=("$LS_PID")
	PORT=$(port_of "$1")
	PB_PID=$(ps -o pid= --ppid "$LS_PID" | tr -d ' ')
	[ -n "$PB_PID" ] || die "no paybuttons under litestream $LS_PID"
	STARTED+=("$PB_PID")
}

# start_server LOG: paybuttons serve alone on $PAYBUTTONS_DB. Sets PB_PID, PORT.
start_server() {
	: >"$1"
	"$PB" serve -addr 127.0.0.1:0 >"$1" 2>&1 &
	PB_PID=$!
	STARTED+=("$PB_PID")
	PORT=$(port_of "$1")
}

# new_key: prints a new key for the site in use, as an operator makes the first one
# (serve writes no key to its log): paybuttons keys create, beside the running server.
new_key() { "$PB" keys create -account drill -db "$PAYBUTTONS_DB" 2>/dev/null; }

# stop PID: SIGTERM, then wait for it to exit.
stop() {
	kill -TERM "$1"
	wait "$1" || true
}

# create NAME: one button through the API; prints its id, fails unless acknowledged.
create() {
	local answer
	answer=$(curl -sS --max-time 10 -X POST "http://127.0.0.1:$PORT/product-payment/create" \
		-H "X-API-KEY: $KEY" -H 'Content-Type: application/json' \
		-d '{"productName":"'"$1"'","amount":"1.00","currency":"USD","paymentMethod":"Stripe","paymentType":"one_time","isLive":false}') ||
		return 1
	case $answer in
	*'"isSuccess":true'*) answer=${answer#*'"data":"'} && printf '%s\n' "${answer%%\"*}" ;;
	*) return 1 ;;
	esac
}

# list_all: every button of the key's account on the server at $PORT, deleted ones
# too, one a line as "id createdAt": `list?state=all&limit=100` pages them newest
# first, each page asked for with after= the `next` of the page before, until
# hasMore is false. Fails unless every page is answered with isSuccess true.
list_all() {
	local after='' page more=true
	while [ "$more" = true ]; do
		page=$(curl -sS --max-time 10 -H "X-API-KEY: $KEY" \
			"http://127.0.0.1:$PORT/product-payment/list?state=all&limit=100${after:+&after=$after}") || return 1
		case $page in
		'{"isSuccess":true,'*) ;;
		*) printf 'list: %s\n' "$page" >&2 && return 1 ;;
		esac
		# Each item has one "id" and one "createdAt", in whatever order its keys come.
		{ grep -Eo '"(id|createdAt)":"[^"]+"' <<<"$page" || true; } | awk -F'"' '
			{ v[$2] = $4 }
			("id" in v) && ("createdAt" in v) { print v["id"], v["createdAt"]; split("", v) }'
		more=$(grep -Eo '"hasMore":(true|false)' <<<"$page" | cut -d: -f2)
		after=$(grep -Eo '"next":"btn_[0-9A-Z]+"' <<<"$page" | cut -d'"' -f4 || true)
		if [ "$more" = true ] && [ -z "$after" ]; then
			printf 'list: hasMore without a next: %s\n' "$page" >&2
			return 1
		fi
	done
}

# ids: every button id of the key's account on the server at $PORT, one a line,
# sorted (list_all's order, newest first, is not relied on).
ids() {
	local all
	all=$(list_all) || return 1
	[ -z "$all" ] || cut -d' ' -f1 <<<"$all" | sort
}

# restore_to FILE [litestream restore flags...]: restore the site's database from its
# replica into FILE, through litestream.yml, as docs/litestream.md says.
restore_to() {
	local out=$1
	shift
	"$LS" restore -config "$CONFIG" "$@" -o "$out" "$PAYBUTTONS_DB"
}
