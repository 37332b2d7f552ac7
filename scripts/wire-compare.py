#!/usr/bin/env python3
"""Compares the daemon's outgoing traffic of two builds, captured by the
test backend (`TUIXIU_TEST_WIRE_LOG=<file>`, docs/protocol.md, "Checking
the wire"), frame by frame, byte for byte, with what differs from run to
run masked: timestamps, uuids, signatures, request ids, pids and other long
digit runs, temporary paths. Frames are compared as multisets (concurrent
runs interleave differently).

usage: wire-compare.py BEFORE.log AFTER.log
prints the frames only one side sent; exits 1 if there are any.
"""
import re
import sys
from collections import Counter

MASKS = [
    (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "<T>"),
    (r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<U>"),
    (r'"req-\d+"', '"req-N"'),
    (r'"signature":"[0-9a-f]+"', '"signature":"<S>"'),
    (r"\d{3,}", "<D>"),
    (r"/tmp/[^\"\s]*", "<TMP>"),
]


def frames(path):
    out = Counter()
    with open(path, encoding="utf-8") as f:
        for line in f:
            for pattern, mask in MASKS:
                line = re.sub(pattern, mask, line)
            out[line.rstrip("\n")] += 1
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    before, after = frames(sys.argv[1]), frames(sys.argv[2])
    only_before, only_after = before - after, after - before
    for line, n in sorted(only_before.items()):
        print(f"- {n}x {line}")
    for line, n in sorted(only_after.items()):
        print(f"+ {n}x {line}")
    print(f"{sum(before.values())} frames before, {sum(after.values())} after; "
          f"{sum(only_before.values())} only before, {sum(only_after.values())} only after")
    sys.exit(1 if only_before or only_after else 0)


if __name__ == "__main__":
    main()
