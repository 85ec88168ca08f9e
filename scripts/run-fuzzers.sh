#!/usr/bin/env bash
# Runs every libFuzzer target of a fuzz build for a bounded time each and
# prints how many inputs each executed and what it found.
#   scripts/run-fuzzers.sh [BUILD_DIR] [SECONDS_EACH] [TARGET...]
# Each target starts from its seeds (fuzz/corpus/<name>) plus what earlier
# runs in BUILD_DIR found. A crash leaves its input in
# BUILD_DIR/fuzz-work/<name>/artifacts/; once the bug is fixed, copy it to
# fuzz/regressions/<name>/ so the ordinary suite replays it for ever.
# Exit status 1 when any target crashed, leaked or timed out.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-fuzz}
secs=${2:-30}
shift 2 2>/dev/null || shift $#
targets=("$@")
if ((${#targets[@]} == 0)); then
  for exe in "$build"/fuzz/fuzz_*; do
    [[ -x $exe && $exe != *fuzz_replay_* ]] || continue
    targets+=("${exe##*/fuzz_}")
  done
fi
if ((${#targets[@]} == 0)); then
  echo "run-fuzzers: no fuzz targets in $build/fuzz (build them with: make fuzz)" >&2
  exit 1
fi
failed=0
printf '%-22s %12s %10s  %s\n' target executions exec/s result
for name in "${targets[@]}"; do
  exe=$build/fuzz/fuzz_$name
  work=$build/fuzz-work/$name
  mkdir -p "$work/corpus" "$work/artifacts"
  log=$work/last-run.log
  "$exe" "$work/corpus" "fuzz/corpus/$name" -max_total_time="$secs" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/artifacts/" >"$log" 2>&1
  rc=$?
  execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log")
  rate=$(awk '/stat::average_exec_per_sec/ {print $2}' "$log")
  result=ok
  if ((rc != 0)); then
    failed=1
    result="FOUND: $(grep -m1 -E 'ERROR: |SUMMARY: ' "$log" | cut -c1-100) -> $(ls -t "$work/artifacts" | head -1)"
  fi
  printf '%-22s %12s %10s  %s\n' "$name" "${execs:-?}" "${rate:-?}" "$result"
done
exit $failed
