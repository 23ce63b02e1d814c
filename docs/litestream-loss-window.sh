#!/usr/bin/env bash
# Measures what acknowledged writes a lost host takes with it when Litestream
# replicates paybuttons with the repository's litestream.yml.
#
#   docs/litestream-loss-window.sh [RUNS] [steady|cpu]
#
# Each run: a fresh database under `litestream replicate -exec "paybuttons serve"`,
# WRITERS clients creating buttons in a loop (each acknowledged create is noted
# with the moment its answer came), then after a random 4 to 12 s both processes
# are killed with SIGKILL at once: the host is gone, only the replica (a file
# replica here) survives. The database is restored from the replica to a fresh
# path, checked, served, and every acknowledged create is looked up.
#
# "cpu" runs the same with BURNERS busy loops beside it (one per core unless
# set). One line a run, then min/median/max of window_s and lag_s:
#   acked         creates answered 200 before the kill
#   restored      buttons in the restored database (answered or not)
#   missing       acknowledged creates not in it: lost with the host
#   holes         missing creates acknowledged more than 50 ms before a restored
#                 one (a replica is a prefix of the commits: must be 0)
#   window_s      the loss window: from the last acknowledged create that was
#                 restored to the last acknowledged create
#   lag_s         how far the replica was behind at the kill: from the last
#                 acknowledged create that was restored to the kill (window_s
#                 plus the time from the last answer to the kill)
#   first_lost_s  how long before the kill the oldest lost create was
#                 acknowledged: the replica was at least that far behind
#   check         paybuttons check of the restored database
set -euo pipefail
source "$(dirname "$0")/litestream-lib.sh"

RUNS=${1:-5}
LOAD=${2:-steady}
WRITERS=${WRITERS:-2}
BURNERS=${BURNERS:-$(nproc)}
case $LOAD in steady | cpu) ;; *) die "load must be steady or cpu, not $LOAD" ;; esac
find_binaries

# writer N: creates buttons until killed; appends "ack-time id" per acknowledged one.
writer() {
	local n=0 id
	while :; do
		n=$((n + 1))
		if id=$(create "w$1-$n"); then
			printf '%s %s\n' "$EPOCHREALTIME" "$id" >>"$RUN/acked.$1"
		fi
	done
}

# burn: one busy loop, for the "cpu" runs.
burn() { while :; do :; done; }

say "litestream $("$LS" version), sync-interval and monitor-interval 1s (litestream.yml), $WRITERS writers, load: $LOAD$([ "$LOAD" = cpu ] && echo " ($BURNERS busy loops)"); $(load)"
printf '%-4s %8s %8s %8s %6s %9s %6s %12s %s\n' run acked restored missing holes window_s lag_s first_lost_s check
windows=() lags=()
for run in $(seq "$RUNS"); do
	RUN=$TMP/run$run
	rm -rf "$TMP/replica"
	use_site "$RUN/primary"
	start_primary "$RUN/primary.log"
	KEY=$(new_key)
	wait_log "$RUN/primary.log" 'msg="snapshot complete"' # replicating: steady state
	busy=() started_at=$EPOCHREALTIME
	for w in $(seq "$WRITERS"); do
		writer "$w" 2>/dev/null &
		busy+=($!)
	done
	if [ "$LOAD" = cpu ]; then
		for _ in $(seq "$BURNERS"); do
			burn &
			busy+=($!)
		done
	fi
	disown "${busy[@]}" # killed below: no "Killed" notices
	STARTED+=("${busy[@]}")
	sleep "$((4 + RANDOM % 8)).$((RANDOM % 10))"

	# Host loss: both processes at once, then the clients.
	kill -KILL "$PB_PID" "$LS_PID"
	killed_at=$EPOCHREALTIME
	kill -KILL "${busy[@]}"
	wait "$LS_PID" 2>/dev/null || true
	STARTED=()

	# Only the replica is left: restore it elsewhere, check it, serve it, compare.
	use_site "$RUN/restored"
	restore_to "$PAYBUTTONS_DB" >"$RUN/restore.log" 2>&1 || die "restore failed: $(cat "$RUN/restore.log")"
	check=$("$PB" check -db "$PAYBUTTONS_DB") || die "check of the restored database: $check"
	start_server "$RUN/restored.log"
	ids >"$RUN/restored.ids"
	stop "$PB_PID"
	STARTED=()

	cat "$RUN/"acked.* >"$RUN/acked"
	read -r acked restored missing holes window lag first_lost < <(awk -v started="$started_at" -v killed="$killed_at" '
		FILENAME == ARGV[1] { have[$1] = 1; restored++; next }
		{
			acked++
			if ($1 > last) last = $1
			if ($2 in have) { if ($1 > last_kept) last_kept = $1 }
			else { missing++; lost[missing] = $1; if (!first || $1 < first) first = $1 }
		}
		END {
			if (!last_kept) last_kept = started # nothing acknowledged was restored
			for (i = 1; i <= missing; i++) if (lost[i] < last_kept - 0.05) holes++
			printf "%d %d %d %d %.3f %.3f %s\n", acked, restored, missing, holes, last - last_kept,
				killed - last_kept, missing ? sprintf("%.3f", killed - first) : "-"
		}' "$RUN/restored.ids" "$RUN/acked")
	printf '%-4s %8s %8s %8s %6s %9s %6s %12s %s\n' "$run" "$acked" "$restored" "$missing" "$holes" "$window" "$lag" "$first_lost" "$check"
	windows+=("$window")
	lags+=("$lag")
	[ "$holes" = 0 ] || say "  ^ $holes acknowledged creates are missing although later ones were restored"
done

# summary NAME VALUES...: min, median and max of the values.
summary() {
	local name=$1
	shift
	printf '%s\n' "$@" | sort -g | awk -v name="$name" '{ v[NR] = $1 } END {
		median = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
		printf "%-7s min %.3f s, median %.3f s, max %.3f s\n", name ":", v[1], median, v[NR]
	}'
}
say "over $RUNS runs, load $LOAD, $(load) at the end:"
summary window "${windows[@]}"
summary lag "${lags[@]}"
