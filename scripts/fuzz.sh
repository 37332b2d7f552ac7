#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ and runs each for SECONDS (default
# 60), one after the other; prints one summary line per target and exits
# non-zero if any target crashed, hung or ran out of memory.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# Needs cargo-fuzz (scripts/ci-setup.d/40-fuzz.sh installs it from
# crates.io) and no nightly toolchain: the machine's one (stable) toolchain
# builds the targets, with RUSTC_BOOTSTRAP=1 so that rustc takes the few
# unstable flags cargo-fuzz passes (-Zsanitizer=address and the like).
# FUZZ_TOOLCHAIN=nightly builds with an installed nightly instead.
# Inputs found are kept in fuzz/corpus/<target> (not committed); the
# seeds in fuzz/seeds/<target> are read, never written. A crashing input
# is saved as fuzz/artifacts/<target>/crash-*; reproduce it with
#   fuzz/target/x86_64-unknown-linux-gnu/release/<target> <file>
# Logs: $FUZZ_LOG_DIR (default fuzz/logs). FUZZ_JOBS=N runs N targets at a
# time (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
case $seconds in
    '' | *[!0-9]*) echo "scripts/fuzz.sh: SECONDS must be a number, got '$seconds'" >&2; exit 2 ;;
esac

cargo=(cargo)
if [ -n "${FUZZ_TOOLCHAIN:-}" ]; then
    cargo+=("+$FUZZ_TOOLCHAIN")
    if ! "${cargo[@]}" --version >/dev/null 2>&1; then
        echo "scripts/fuzz.sh: the toolchain FUZZ_TOOLCHAIN=$FUZZ_TOOLCHAIN is not installed" >&2
        exit 2
    fi
fi
export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "scripts/fuzz.sh: cargo-fuzz is missing (cargo install cargo-fuzz --locked)" >&2
    exit 2
fi

targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    mapfile -t targets < <(cd fuzz && "${cargo[@]}" fuzz list)
fi

# The lock file is committed: refuse to build with other versions.
(cd fuzz && "${cargo[@]}" metadata --locked --format-version 1 >/dev/null)
echo "==> building ${#targets[@]} fuzz targets"
build_args=(build --codegen-units "${FUZZ_CODEGEN_UNITS:-16}")
if [ "${#targets[@]}" -eq 1 ]; then build_args+=("${targets[0]}"); fi
(cd fuzz && "${cargo[@]}" fuzz "${build_args[@]}")
bin_dir=fuzz/target/x86_64-unknown-linux-gnu/release

log_dir=${FUZZ_LOG_DIR:-fuzz/logs}
mkdir -p "$log_dir"
# Scratch trees of the targets: a tmpfs when there is one.
scratch_base=/tmp
[ -d /dev/shm ] && [ -w /dev/shm ] && scratch_base=/dev/shm
scratch=$(mktemp -d "$scratch_base/tuixiu-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

# Per-target libFuzzer options beyond the common ones.
extra_args() {
    case $1 in
        # Quadratic scans show only on long inputs.
        skills_answer) echo "-max_len=65536" ;;
        zip_extract) echo "-max_len=65536" ;;
        *) echo "-max_len=16384" ;;
    esac
}

run_target() {
    local target=$1 log="$log_dir/$1.log"
    local corpus=fuzz/corpus/$target artifacts=fuzz/artifacts/$target
    mkdir -p "$corpus" "$artifacts" "$scratch/$target"
    local args=(-max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$artifacts/" $(extra_args "$target"))
    [ -f "fuzz/dicts/$target.dict" ] && args+=(-dict="fuzz/dicts/$target.dict")
    local status=0
    TMPDIR="$scratch/$target" "$bin_dir/$target" "${args[@]}" "$corpus" "fuzz/seeds/$target" >"$log" 2>&1 ||
        status=$?
    echo "$status" >"$log.status"
}

jobs_max=${FUZZ_JOBS:-1}
echo "==> running each target for ${seconds}s (logs in $log_dir)"
for target in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
    run_target "$target" &
done
wait

failed=0
printf '%-16s %6s %10s %8s %8s %8s %6s  %s\n' target status execs exec/s cov ft corpus result
for target in "${targets[@]}"; do
    log="$log_dir/$target.log"
    status=$(cat "$log.status" 2>/dev/null || echo '?')
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    units=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$last")
    result=ok
    if [ "$status" != 0 ]; then
        result="FAILED: $(grep -m1 -E 'panicked at|ERROR: libFuzzer|==[0-9]+==ERROR' "$log" | cut -c1-120)"
        failed=1
    fi
    printf '%-16s %6s %10s %8s %8s %8s %6s  %s\n' "$target" "$status" "${execs:--}" "${rate:--}" "${cov:--}" \
        "${ft:--}" "${units:--}" "$result"
done
if [ "$failed" != 0 ]; then
    echo "scripts/fuzz.sh: a target failed; the input is in fuzz/artifacts/<target>/, the log in $log_dir/" >&2
fi
exit "$failed"
