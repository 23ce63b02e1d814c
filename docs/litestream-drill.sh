#!/usr/bin/env bash
# The Litestream drill (docs/litestream.md, "The drill"), which CI runs as
# `bash docs/litestream-drill.sh`: the runbook's steps against a file replica in a temporary
# directory, with the repository's litestream.yml and deploy/paybuttons.service's command line.
# Litestream is $LITESTREAM, else v0.5.18 installed once into
# ${XDG_CACHE_HOME:-$HOME/.cache}/paybuttons-ci/; paybuttons is built from this checkout. Where
# the drill cannot run it prints "skipped: WHY" and exits 0. It exits 1 if a check failed; its
# last line says how many checks passed.
set -Eeuo pipefail
VERSION=v0.5.18
REPO=$(cd "$(dirname "$0")/.." && pwd)
CONFIG=$REPO/litestream.yml

skip() { echo "skipped: $*" && exit 0; }
[ "$(uname -s)" = Linux ] || skip "the Litestream drill runs on Linux only, not $(uname -s)"
command -v curl >/dev/null || skip "the Litestream drill needs curl"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/paybuttons-drill.XXXXXX")
PIDS=() # what to kill if the drill stops early
passed=0 failed=0 done=no
finish() {
	local rc=$?
	kill -KILL "${PIDS[@]}" 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$TMP"
	[ "$rc" = 0 ] || [ "$done" = yes ] ||
		echo "drill FAILED: it stopped early, after $passed checks passed and $failed failed"
}
trap finish EXIT
trap 'echo "drill: line $LINENO failed: $BASH_COMMAND" >&2' ERR

dir=${XDG_CACHE_HOME:-$HOME/.cache}/paybuttons-ci/litestream-$VERSION
LS=${LITESTREAM:-$dir/litestream}
if [ -z "${LITESTREAM:-}" ] && [ ! -x "$LS" ]; then
	echo "installing Litestream $VERSION into $dir"
	GOBIN=$dir go install "github.com/benbjohnson/litestream/cmd/litestream@$VERSION" \
		>"$TMP/install.log" 2>&1 ||
		skip "cannot install Litestream $VERSION (no network?): $(tail -1 "$TMP/install.log")"
fi
PB=$TMP/bin/paybuttons
(cd "$REPO" && CGO_ENABLED=0 go build -o "$PB" .)
export LITESTREAM_REPLICA_URL=file://$TMP/replica PAYBUTTONS_ADDR=127.0.0.1:0
# The unit's command line: deploy/paybuttons.service's ExecStart=, with this drill's binaries
# and configuration in place of those in /usr/local/bin and /etc/paybuttons.
UNIT=$(awk '/^ExecStart=/ { on = 1; sub(/^ExecStart=/, "") }
	on { more = sub(/ *\\$/, ""); sub(/^ +/, ""); printf "%s ", $0; if (!more) exit }' \
	"$REPO/deploy/paybuttons.service")
UNIT=${UNIT//\/usr\/local\/bin\/litestream/$(printf %q "$LS")}
UNIT=${UNIT//\/usr\/local\/bin\/paybuttons/$PB}
UNIT=${UNIT//\/etc\/paybuttons\/litestream.yml/$(printf %q "$CONFIG")}
commit=$(git -C "$REPO" describe --always --dirty 2>/dev/null || true)
echo "drill of $(date -u +%F) at commit $commit: Litestream $("$LS" version)," \
	"load average $(cut -d' ' -f1 /proc/loadavg) on $(nproc) cores"
echo "the unit's command line: ${UNIT//$TMP/\$TMP}"

# check WHAT GOT WANT: one check, printed as ok or FAIL.
check() {
	if [ "$2" = "$3" ]; then passed=$((passed + 1)) && echo "  ok   $1: $2"; else
		failed=$((failed + 1)) && echo "  FAIL $1: got $2, want $3"; fi
}
# yes_no COMMAND...: prints yes if COMMAND succeeds, else no.
yes_no() { if "$@"; then echo yes; else echo no; fi; }
# count IDS FILE: how many of the lines of IDS are lines of FILE.
count() { grep -cxFf "$1" "$2" || true; }
# within SECONDS COMMAND...: runs COMMAND every 0.1 s until it succeeds; fails after SECONDS.
within() {
	local end=$((SECONDS + $1)); shift
	until "$@"; do
		[ "$SECONDS" -lt "$end" ] || return 1
		sleep 0.1
	done
}
# gone PID: PID has exited (a zombie has too).
gone() { case $(ps -o stat= -p "$1" || true) in '' | Z*) ;; *) return 1 ;; esac; }
# stop PID: SIGTERM, then waits up to 30 s for PID to exit.
stop() { kill -TERM "$1" && within 30 gone "$1" && { wait "$1" 2>/dev/null || true; }; }
# host NAME: the host whose database is $TMP/NAME/paybuttons.db, as litestream.yml reads it.
host() { mkdir -p "$TMP/$1" && export PAYBUTTONS_DB=$TMP/$1/paybuttons.db; }
# listening LOG: waits for paybuttons' "listening" line in LOG; sets URL from it.
listening() {
	within 20 grep -qs 'msg=listening' "$1" || { cat "$1" >&2 && return 1; }
	URL=$(grep -o 'msg=listening url=[^ ]*' "$1" | cut -d= -f3)
}
# unit LOG: the unit's command line for the host in use: Litestream, and paybuttons as its
# child 2 s later. Sets LS_PID, PB_PID and URL.
unit() {
	(eval "exec $UNIT") >"$1" 2>&1 &
	LS_PID=$! && PIDS+=("$LS_PID")
	listening "$1"
	PB_PID=$(pgrep -P "$LS_PID") && PIDS+=("$PB_PID")
}
# restore OUT [FLAG...]: litestream restore of the host in use into the new file OUT.
restore() {
	local out=$1; shift
	rm -f "$out"*
	"$LS" restore -config "$CONFIG" "$@" -o "$out" "$PAYBUTTONS_DB" >"$TMP/restore.log" 2>&1 ||
		{ cat "$TMP/restore.log" >&2 && return 1; }
}
# create NAME: one button through the API; prints its id, fails unless it was created.
create() {
	curl -sS --max-time 10 -X POST "$URL/product-payment/create" -H "X-API-KEY: $KEY" \
		-H 'Content-Type: application/json' -d '{"productName":"'"$1"'","amount":"1.00",
		"currency":"USD","paymentMethod":"Stripe","paymentType":"one_time","isLive":false}' |
		grep -o '"data":"btn_[^"]*"' | cut -d'"' -f4
}
# list: every button id the server at $URL serves, deleted ones too, sorted. A page holds at
# most limit buttons and at most 256 KiB of them: the next page is asked for while hasMore.
list() {
	local page after=''
	while :; do
		page=$(curl -sS --max-time 10 -H "X-API-KEY: $KEY" \
			"$URL/product-payment/list?state=all&limit=100${after:+&after=$after}")
		grep -q '^{"isSuccess":true' <<<"$page" || { echo "list: $page" >&2 && return 1; }
		grep -o '"id":"btn_[^"]*"' <<<"$page" | cut -d'"' -f4 || true
		grep -q '"hasMore":true' <<<"$page" || break
		after=$(grep -o '"next":"btn_[^"]*"' <<<"$page" | cut -d'"' -f4) ||
			{ echo "list: hasMore without next: $page" >&2 && return 1; }
	done | sort
}
# ids DB: list, from a paybuttons serve of DB alone (logging to DB.log).
ids() {
	local URL pid
	"$PB" serve -db "$1" >"$1.log" 2>&1 &
	pid=$! && PIDS+=("$pid")
	listening "$1.log" && list && stop "$pid"
}
# copy NAME [FLAG...]: restores the newest copy (or, with -timestamp T, the copy as of T) into
# $TMP/NAME.db, checks it with paybuttons check and writes the ids it serves to $TMP/NAME.ids.
copy() {
	local name=$1; shift
	restore "$TMP/$name.db" "$@"
	check "paybuttons check of the copy" "$("$PB" check -db "$TMP/$name.db" 2>&1)" ok
	ids "$TMP/$name.db" >"$TMP/$name.ids"
}
# replica_has IDS: the newest copy on the replica holds every button in the file IDS.
replica_has() {
	restore "$TMP/probe.db" 2>/dev/null && ids "$TMP/probe.db" >"$TMP/probe.ids" &&
		[ "$(count "$1" "$TMP/probe.ids")" = "$(wc -l <"$1")" ]
}
# verifies WANT WHAT [VAR=VALUE...]: runs deploy/paybuttons-verify-replica.sh for the host in
# use, as the timer does, with the VARs set; checks that its line starts with WANT.
verifies() {
	local want=$1 what=$2 out; shift 2
	out=$(env "$@" PATH="$(dirname "$LS"):$TMP/bin:$PATH" TMPDIR="$TMP" \
		bash "$REPO/deploy/paybuttons-verify-replica.sh" -config "$CONFIG" 2>&1) || true
	echo "  ${out:0:200}"
	check "$what" "${out%%:*}" "$want"
}

echo "== 1. host A runs the unit: batch 1, a moment T, then batch 2 until host A is lost"
host A
unit "$TMP/A.log"
KEY=$("$PB" keys create -account drill -db "$PAYBUTTONS_DB" 2>/dev/null)
for i in $(seq 20); do create "one-$i"; done >"$TMP/batch1"
within 30 replica_has "$TMP/batch1"
T=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ) T_epoch=$EPOCHREALTIME
( # batch 2: creates without pause, each acknowledged one written down with its time
	n=0
	while n=$((n + 1)); do
		if id=$(create "two-$n"); then echo "$EPOCHREALTIME $id"; fi
	done >"$TMP/batch2.acked"
) 2>/dev/null &
PIDS+=("$!")
sleep "$((2 + RANDOM % 3)).$((RANDOM % 10))" # host A is lost at a moment nobody chose
{ kill -KILL "$!" "$PB_PID" "$LS_PID" && wait "$!" "$LS_PID"; } 2>/dev/null || true
cut -d' ' -f2 "$TMP/batch2.acked" >"$TMP/batch2"
echo "  batch 1: 20 creates, on the replica at T = $T;" \
	"batch 2: $(wc -l <"$TMP/batch2") creates acknowledged, then kill -9 of both"

echo "== 2. host loss: the newest copy, restored, checked and served"
copy newest
check "batch 1 in the newest copy" "$(count "$TMP/batch1" "$TMP/newest.ids")" 20
# The loss window: from the last acknowledged create restored to the last acknowledged one.
read -r acked kept holes window < <(awk -v start="$T_epoch" 'NR == FNR { have[$1]; next }
	{ acked++; last = $1 } $2 in have { kept++; t = $1; if (acked > kept) holes++ }
	END { printf "%d %d %d %.3f\n", acked, kept, holes, last - (kept ? t : start) }' \
	"$TMP/newest.ids" "$TMP/batch2.acked")
echo "  batch 2: $kept of $acked acknowledged creates restored, the last $((acked - kept)) lost"
check "batch 2's creates missing before its last one restored" "$holes" 0
check "the loss window, $window s, is under 5 s" "$(yes_no awk "BEGIN { exit !($window < 5) }")" yes
cp -a "$TMP/replica" "$TMP/replica-stale" # for step 6: the replica as host A left it

echo "== 3. point-in-time restore to T"
copy at-T -timestamp "$T"
check "batch 1 (before T) in the copy as of T" "$(count "$TMP/batch1" "$TMP/at-T.ids")" 20
check "batch 2 (after T) in the copy as of T" "$(count "$TMP/batch2" "$TMP/at-T.ids")" 0

echo "== 4. standby takeover: host B, with no database, starts the unit"
host B
unit "$TMP/B.log"
check "host B restored the replica before paybuttons started" \
	"$(grep -c 'msg="restore completed"' "$TMP/B.log")" 1
check "host B serves the newest copy's buttons" "$(yes_no cmp -s <(list) "$TMP/newest.ids")" yes
for i in $(seq 10); do create "three-$i"; done >"$TMP/batch3"

echo "== 5. shutdown: SIGTERM to host B's Litestream, which passes it to paybuttons"
stop "$LS_PID"
check "paybuttons stopped cleanly" "$(grep -c 'msg=stopped' "$TMP/B.log")" 1
check "the WAL left beside the database for Litestream" "$(yes_no test -s "$PAYBUTTONS_DB-wal")" yes
copy stopped
check "batch 3 (host B's creates) in the newest copy" "$(count "$TMP/batch3" "$TMP/stopped.ids")" 10

echo "== 6. the hourly verification, on host B"
verifies "replica verified" "verification of the replica"
verifies "REPLICA VERIFICATION FAILED" "verification of the replica as host A left it, MAX_LAG=0" \
	LITESTREAM_REPLICA_URL="file://$TMP/replica-stale" MAX_LAG=0
cp -a "$TMP/replica" "$TMP/replica-damaged"
newest=$(ls "$TMP/replica/ltx/0" | sort | tail -1) # MINTXID-MAXTXID.ltx
for f in "$TMP"/replica-damaged/ltx/*/*-"${newest#*-}"; do # each file a restore may end on
	printf 'damaged' | dd of="$f" bs=1 seek=200 conv=notrunc 2>/dev/null
done
verifies "REPLICA VERIFICATION FAILED" "verification of a replica whose newest files are damaged" \
	LITESTREAM_REPLICA_URL="file://$TMP/replica-damaged"

echo "== 7. rollback: the copy as of T becomes host B's database, and host B goes on"
restore "$TMP/as-of-T.db" -timestamp "$T"
mkdir "$TMP/B-before"
mv "$TMP/B/"paybuttons.db* "$TMP/B/.paybuttons.db-litestream" "$TMP/B-before/"
mv "$TMP/as-of-T.db" "$PAYBUTTONS_DB"
unit "$TMP/B2.log"
for i in $(seq 10); do create "four-$i"; done >"$TMP/batch4"
stop "$LS_PID"
copy rolled-back
check "batch 1 in the newest copy" "$(count "$TMP/batch1" "$TMP/rolled-back.ids")" 20
cat "$TMP/batch2" "$TMP/batch3" >"$TMP/rolled-back.want-none"
check "batches 2 and 3 in it" "$(count "$TMP/rolled-back.want-none" "$TMP/rolled-back.ids")" 0
check "batch 4 (after the rollback) in it" "$(count "$TMP/batch4" "$TMP/rolled-back.ids")" 10

done=yes
echo "drill $([ "$failed" = 0 ] && echo passed || echo FAILED):" \
	"$passed of $((passed + failed)) checks passed, in $SECONDS s"
exit $((failed > 0))
