#!/usr/bin/env bash
# `make fuzz`: every fuzz target (fuzz/fuzz_targets/, bodies in crates/layerdiff-fuzz) under
# libFuzzer with AddressSanitizer, for FUZZ_SECONDS each (default 600), FUZZ_JOBS at a time
# (default 1), from small valid files (fuzz/seeds.py) and the checked-in corpus. A crash stops
# it with the input's path: fix the cause, then copy the input to fuzz/regressions/TARGET/,
# which `make test` replays. Each target's kept inputs are then minimized into fuzz/corpus/.
# The figures (runs, coverage, corpus) go to target/fuzz/TARGET.log's last lines.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-600}
jobs=${FUZZ_JOBS:-1}
targets=${FUZZ_TARGETS:-"onnx_model inputs comparison"}
keep=${FUZZ_KEEP:-400}
work=target/fuzz
mkdir -p "$work"
.venv/bin/python fuzz/seeds.py "$work/seeds"
cargo +nightly fuzz build --release

run() {
  local t=$1
  mkdir -p "$work/corpus/$t" "fuzz/corpus/$t" "fuzz/artifacts/$t"
  # -malloc_limit_mb: one allocation past it is a crash (an input that asks for memory its
  # size does not justify); -rss_limit_mb: the whole process.
  cargo +nightly fuzz run --release "$t" "$work/corpus/$t" "fuzz/corpus/$t" "$work/seeds/$t" -- \
    -max_total_time="$seconds" -rss_limit_mb=4096 -malloc_limit_mb=1024 -timeout=30 \
    -print_final_stats=1 >"$work/$t.log" 2>&1 || {
      echo "fuzz: $t crashed; see $work/$t.log and fuzz/artifacts/$t/" >&2
      return 1
    }
  grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|Done)|cov:" "$work/$t.log" \
    | tail -4 | sed "s/^/$t: /"
  # the smallest set of inputs with the same coverage (kept in target/fuzz/corpus/, where the
  # next run starts), and a sample of it checked in: its inputs of 1 KB or less, at most
  # $keep of them (named by their hash: a sample of no particular kind)
  cargo +nightly fuzz cmin --release "$t" "$work/corpus/$t" >"$work/$t.cmin.log" 2>&1
  rm -rf "fuzz/corpus/$t"
  mkdir -p "fuzz/corpus/$t"
  # (sed reads the whole list: `head` would end the pipe early, which pipefail counts a failure)
  find "$work/corpus/$t" -type f -size -1025c | sort | sed -n "1,${keep}p" \
    | xargs -r cp -t "fuzz/corpus/$t/"
  echo "$t: $(ls "$work/corpus/$t" | wc -l) inputs after minimizing, $(ls "fuzz/corpus/$t" | wc -l) checked in"
}

failed=0
running=0
for t in $targets; do
  run "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n || failed=1
    running=$((running - 1))
  fi
done
while [ "$running" -gt 0 ]; do
  wait -n || failed=1
  running=$((running - 1))
done
[ "$failed" = 0 ] || exit 1

