# Sourced by every benchmark under scripts/bench.d/ (run them through
# scripts/bench): the parts they share, written once.
#   * the working directory is the repository's root;
#   * REL: the release build directory (CARGO_TARGET_DIR honoured), absolute;
#   * bench_build ARGS...: `cargo build --release --quiet ARGS...`, skipped
#     when NO_BUILD is set (use the release builds as they are);
#   * bench_install COMMAND:PACKAGE...: apt-get installs PACKAGE where
#     COMMAND is missing;
#   * bench_machine [EXTRA...]: one line naming the machine and its load;
#   * bench_load: the load averages (1, 5, 15 min);
#   * bench_scratch [BASE]: a fresh private directory under BASE (/tmp,
#     /dev/shm or /var/tmp; default /tmp), removed when the benchmark exits
#     (bench_cleanup, the EXIT trap; a benchmark with its own trap calls
#     bench_cleanup from it). Its name carries the benchmark's pid, so one
#     made in a command substitution is removed too;
#   * bench_ab_rounds ROUNDS A B FN: the interleaved A/B rounds, FN ROUND
#     LABEL BINARY called for A then B in each of ROUNDS rounds, so both
#     see the same machine and load (scripts/bench.d/abbench.py does the
#     same for single commands, timed in-process).
# shellcheck shell=bash
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
REL=$(realpath -m "${CARGO_TARGET_DIR:-target}")/release

bench_build() {
    [ -n "${NO_BUILD:-}" ] || cargo build --release --quiet "$@"
}

bench_install() {
    local tool
    for tool in "$@"; do
        command -v "${tool%%:*}" >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${tool##*:}"; }
    done
}

bench_load() {
    cut -d' ' -f1-3 /proc/loadavg
}

bench_machine() {
    local extra=""
    [ $# -eq 0 ] || extra=", $*"
    echo "machine: $(nproc) cores ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r), load $(bench_load)$extra"
}

bench_scratch() {
    mktemp -d "${1:-/tmp}/tuixiu-bench-$$-XXXXXX"
}

bench_cleanup() {
    rm -rf /tmp/tuixiu-bench-$$-* /dev/shm/tuixiu-bench-$$-* /var/tmp/tuixiu-bench-$$-*
}
trap bench_cleanup EXIT

bench_ab_rounds() {
    local rounds=$1 a=$2 b=$3 fn=$4 r
    for r in $(seq 1 "$rounds"); do
        "$fn" "$r" A "$a"
        "$fn" "$r" B "$b"
    done
}
