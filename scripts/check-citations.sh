#!/usr/bin/env bash
# The repository explains itself: comments in code and scripts cite only
# what the repository holds. Fails, listing file:line, on
#   * a citation of a document outside the repository: a design seed
#     (`seed 002 §8.2`), the reference notes (`reference §1.3`, their file
#     names), a section sign, an `[QUIRK]`/`[SEC]` tag from those notes, an
#     issue number of the tracker (`issue 18`), a spec page (`*.mdx`), a
#     path to the documents beside the repository (`/work/shared`,
#     `../shared`, `HELPERS.md`);
#   * a `docs/NAME.md` that does not exist, and a cited section
#     (`docs/NAME.md, "Heading"`) that no heading of that file contains.
# Scans src, sandbox/src, tests, scripts, examples, fuzz/fuzz_targets,
# build.rs and deploy. Root-free, a second or so; scripts/test.sh runs it.
#
#   scripts/check-citations.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "$@" <<'PY'
import os, re, sys

ROOTS = ["src", "sandbox/src", "tests", "scripts", "examples", "fuzz/fuzz_targets", "build.rs", "deploy"]
SELF = "scripts/check-citations.sh"

OUTSIDE = re.compile(
    r"\bseeds? ?0\d\d\b(?!_)"           # seed 002, seed000 (test names seed000_* stay)
    r"|\bseed (?:documents?|notes?)\b"
    r"|\breference (?:§|REF\b|[\w.-]+\.md)"
    r"|§"
    r"|\[(?:QUIRK|SEC)\]"
    r"|\bissues? #?\d+"
    r"|\.mdx\b"
    r"|/work/(?:shared|notes)\b|\.\./shared/|\bshared/(?:seeds|reference|design)\b"
    r"|\bHELPERS\.md\b|\bGUIDE\.md\b"
    r"|\b(?:tuixiu-wire-protocol|skill-runner-protocol|acp-client|sandbox-anchors|bwrap-0\.11-cli)\.md\b",
    re.IGNORECASE,
)
DOC = re.compile(r"\bdocs/([\w.-]+\.md)\b")
# A cited section: docs/NAME.md, "Heading"[, "Heading"...], possibly across
# comment lines.
SECTION = re.compile(r'\bdocs/([\w.-]+\.md),\s*((?:"[^"]+"(?:,\s*)?)+)')
PREFIX = re.compile(r"^\s*(?://[!/]?|#|\*|--)\s?")


def files():
    for root in ROOTS:
        if os.path.isfile(root):
            yield root
            continue
        for d, dirs, names in os.walk(root):
            dirs[:] = sorted(x for x in dirs if x not in ("target", "__pycache__", "corpus"))
            for n in sorted(names):
                yield os.path.join(d, n)


headings = {}


def norm(text):
    # Backticks and line breaks in a cited title do not matter.
    return " ".join(text.replace("`", "").split())


def heading_texts(name):
    if name not in headings:
        out, fence = [], False
        try:
            with open(os.path.join("docs", name), encoding="utf-8") as f:
                for line in f:
                    if line.startswith("```"):
                        fence = not fence
                    elif not fence and line.startswith("#"):
                        out.append(line.lstrip("#").strip())
        except OSError:
            out = None
        headings[name] = out
    return headings[name]


problems = []
for path in files():
    if path == SELF:
        continue
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except (UnicodeDecodeError, OSError):
        continue  # binary fixtures, archives
    for i, line in enumerate(lines):
        where = f"{path}:{i + 1}"
        for m in OUTSIDE.finditer(line):
            problems.append(f"{where}: cites outside the repository ({m.group(0)!r}): {line.strip()}")
        for m in DOC.finditer(line):
            if not os.path.isfile(os.path.join("docs", m.group(1))):
                problems.append(f"{where}: docs/{m.group(1)} does not exist")
        if "docs/" not in line:
            continue
        # The line and the next two, comment markers dropped, for sections
        # split across lines.
        joined = line + "".join(" " + PREFIX.sub("", l) for l in lines[i + 1 : i + 3])
        for m in SECTION.finditer(joined):
            if m.start() >= len(line):
                break
            texts = heading_texts(m.group(1))
            if texts is None:
                continue  # reported above
            for title in re.findall(r'"([^"]+)"', m.group(2)):
                if not any(norm(title) in norm(t) for t in texts):
                    problems.append(f'{where}: docs/{m.group(1)} has no heading containing "{title}"')

for p in problems:
    print(p)
if problems:
    print(f"check-citations: {len(problems)} problem(s): comments must cite docs/ (see docs/architecture.md)", file=sys.stderr)
    sys.exit(1)
print("check-citations: ok")
PY
