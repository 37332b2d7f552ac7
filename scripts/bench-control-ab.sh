#!/usr/bin/env bash
# Kept for existing callers: `scripts/bench control-ab` is the benchmark.
exec "$(dirname "$0")/bench" control-ab "$@"
