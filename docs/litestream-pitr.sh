#!/usr/bin/env bash
# Measures how precise `litestream restore -timestamp T` is for paybuttons: of the
# buttons created before T, which the restore lacks (those of the last N seconds
# before T), and that it holds none created after T (a restore at T only uses
# files whose every transaction Litestream had read before T).
#
#   docs/litestream-pitr.sh [MOMENTS]
#
# Two phases, each with one client creating buttons for about 20 s and MOMENTS
# (default 5) moments T noted at random while it writes:
#   kept:    the repository's litestream.yml, restored 3 s later: every L0 file
#            (one per sync, a second apart) is there, as for 7 days in production.
#   expired: the same with l0-retention cut to 10 s, restored once the L0 files of
#            the writing period are gone: only 30-second L1 files are left, which
#            is what Litestream's default (5 min) leaves of anything older than
#            5 minutes. Takes a minute more.
set -euo pipefail
source "$(dirname "$0")/litestream-lib.sh"
MOMENTS=${1:-5}
find_binaries

# epoch TIME: RFC 3339 time as seconds since 1970, with milliseconds.
epoch() { date -u -d "$1" +%s.%3N; }

# buttons: "id createdAt" of every button on the server at $PORT, oldest first.
buttons() { list_all | sort -k2,2; }

phase() {
	local name=$1 t gap before kept after gaps=()
	rm -rf "$TMP/replica" "$TMP/host"
	use_site "$TMP/host"
	start_primary "$TMP/$name.log"
	KEY=$(new_key)
	wait_log "$TMP/$name.log" 'msg="snapshot complete"'
	(
		n=0
		while :; do
			n=$((n + 1))
			create "$name-$n" >/dev/null 2>&1 || true
		done
	) &
	local client=$!
	disown "$client" # killed below: no "Killed" notice
	local moments=()
	sleep 2
	for _ in $(seq "$MOMENTS"); do
		sleep "$((1 + RANDOM % 3)).$((RANDOM % 10))"
		moments+=("$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)")
	done
	sleep 2
	kill -KILL "$client"
	buttons >"$TMP/$name.primary"
	local written_until
	written_until=$(tail -1 "$TMP/$name.primary" | cut -d' ' -f2)
	if [ "$name" = expired ]; then
		say "waiting for the L0 files of the writing period to be compacted into L1 and deleted"
		for _ in $(seq 90); do
			first=$("$LS" ltx -config "$CONFIG" -level 0 "$PAYBUTTONS_DB" | awk 'NR == 2 { print $5 }')
			[ -n "$first" ] && [ "$(epoch "$first" | cut -d. -f1)" -gt "$(epoch "$written_until" | cut -d. -f1)" ] && break
			sleep 1
		done
		"$LS" ltx -config "$CONFIG" -level 1 "$PAYBUTTONS_DB" | indent
	else
		sleep 3
	fi
	stop "$LS_PID"
	STARTED=()

	local host=$PAYBUTTONS_DB
	for t in "${moments[@]}"; do
		use_site "$TMP/$name.$RANDOM"
		restore_to "$PAYBUTTONS_DB" -timestamp "$t" >/dev/null 2>&1 || die "restore at $t failed"
		start_server "$TMP/$name.restored.log"
		buttons >"$TMP/restored"
		stop "$PB_PID"
		STARTED=()
		# Times as seconds of the day (the run must not cross midnight UTC).
		read -r before kept after gap < <(awk -v t="$t" '
			function sec(s) { split(substr(s, 12, 12), p, ":"); return p[1] * 3600 + p[2] * 60 + p[3] }
			BEGIN { T = sec(t) }
			FILENAME == ARGV[1] { restored[$1] = 1; if (sec($2) >= T) after++; next }
			sec($2) < T { before++; if ($1 in restored) kept++; else if (!oldest || sec($2) < oldest) oldest = sec($2) }
			END { printf "%d %d %d %.3f\n", before, kept, after, oldest ? T - oldest : 0 }' "$TMP/restored" "$TMP/$name.primary")
		say "  T $t: $kept of the $before buttons created before T restored (missing: those of the last $gap s); $after created after T"
		gaps+=("$gap")
		[ "$after" = 0 ] || say "  ^ a restore at T holds buttons created after T"
	done
	use_site "$(dirname "$host")"
	printf '%s\n' "${gaps[@]}" | sort -g | awk -v name="$name" '{ v[NR] = $1 } END {
		median = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
		printf "%s: a restore at T misses the buttons of the last %.3f to %.3f s before T (median %.3f s), %d moments\n", name, v[1], v[NR], median, NR
	}'
}

say "litestream $("$LS" version), litestream.yml: monitor-interval 1s, sync-interval 1s, levels 30s/5m/1h; $(load)"
say ""
say "== kept: every L0 file still there"
phase kept
say ""
say "== expired: l0-retention 10s, the writing period only in 30 s L1 files"
sed -e 's/^l0-retention: .*/l0-retention: 10s\nl0-retention-check-interval: 2s/' "$REPO/litestream.yml" >"$TMP/expired.yml"
CONFIG=$TMP/expired.yml
phase expired
say "$(load) at the end"
