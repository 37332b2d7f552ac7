#!/usr/bin/env python3
"""Writes a deterministic zip of text-like files, for the extraction benchmarks.

    make-zip.py OUT.zip --files N --file-bytes B [--dirs D] [--level 6]

N files of B bytes each (`dirNN/fileNNNNNN.txt`, spread over D directories),
deflated with zlib at the given level (Python's zipfile, as
scripts/bench extract always did). The text is words of 2-9 random
letters, a newline after about one word in ten: it deflates to a little
over half its size, like source code. Each file is a different window of a
4 MiB pool of such text, so files do not repeat within deflate's 32 KiB
window and a large archive costs no more to generate than to compress.
Prints the archive's size.
"""
import argparse
import os
import random
import zipfile

POOL = 4 << 20


def pool_text():
    rng = random.Random(42)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    out, size = [], 0
    while size < POOL:
        w = rng.choice(words) + (" " if rng.random() > 0.1 else "\n")
        out.append(w)
        size += len(w)
    return "".join(out)[:POOL].encode()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--files", type=int, required=True)
    ap.add_argument("--file-bytes", type=int, required=True)
    ap.add_argument("--dirs", type=int, default=40)
    ap.add_argument("--level", type=int, default=6)
    a = ap.parse_args()
    text = pool_text()
    doubled = text + text
    with zipfile.ZipFile(a.out, "w", zipfile.ZIP_DEFLATED, compresslevel=a.level) as z:
        for i in range(a.files):
            start = (i * 2654435761) % POOL
            size = a.file_bytes
            if size <= POOL:
                data = doubled[start:start + size]
            else:
                data = (doubled[start:] + text * (size // POOL + 1))[:size]
            z.writestr(f"dir{i % max(a.dirs, 1):02d}/file{i:06d}.txt", data)
    print(os.path.getsize(a.out))


if __name__ == "__main__":
    main()
