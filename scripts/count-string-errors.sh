#!/bin/sh
# Counts `Result<_, String>` in src/ outside tests (at most 12,
# each with a reason: docs/architecture.md, "Layers"). A `#[cfg(test)]
# mod` runs to the end of its file by the project's habit, so everything
# after its line is left out.
# usage: scripts/count-string-errors.sh [-v]
cd "$(dirname "$0")/.." || exit 1
for f in $(find src -name '*.rs' ! -path '*/tests/*' ! -name tests.rs | sort); do
    awk -v f="$f" '/^#\[cfg\(test\)\]/ { exit } /Result<.*, String>/ { print f ":" NR ": " $0 }' "$f"
done | { if [ "$1" = -v ]; then cat; else wc -l; fi; }
