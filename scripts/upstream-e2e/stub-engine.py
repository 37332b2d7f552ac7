#!/usr/bin/env python3
"""A stub engine for scripts/upstream-e2e.py, run inside the job's sandbox.

It obeys the engine contract (the prompt is the last argument, the
working directory is the run directory /workspace, files go to
artifacts/, the answer is JSON on stdout) without a model, and does what
each of upstream's fixture skills tells its agent to do (their SKILL.md),
right or wrong on purpose, so that the suites expecting a failure can
fail:

* demo-prime-number: reads the uploaded file, divides each number by the
  divisor, runs the skill's own scripts/check_primes.py on the integers,
  writes primes.md and results.json;
* demo-bible-verse: writes text.md and info.json in the asked language;
* demo-pandas-stats: runs the skill's scripts/analyze.py on the CSV (the
  mean computed here with the csv module when pandas is not installed in
  the sandbox's view of the host), answers its JSON;
* demo-bad-output: answers {"message": ...} without the required result;
* demo-missing-artifacts: answers {"result_artifact": ""} and writes no
  file;
* demo-missing-result: prints nothing;
* any other skill (the literature-digest stand-in): one file per artifact
  its output schema declares, and their paths as the answer.

Parameters come from the prompt: the default prompt's `- key: value`
lines, or the skill's own template.
"""
import csv
import json
import os
import re
import subprocess
import sys

SKILL = "/skill"


def params(prompt):
    """`- key: value` lines of the default prompt."""
    return dict(re.findall(r"^- ([A-Za-z0-9_]+): (.*)$", prompt, re.M))


def answer(value):
    print(json.dumps(value))


def write(rel, text):
    path = os.path.join("artifacts", rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return os.path.join(os.getcwd(), path)


def prime_number(prompt):
    divisor = int(params(prompt).get("divisor", "1"))
    with open(os.path.join("uploads", "input_file"), encoding="utf-8") as f:
        lines = [l.strip() for l in f if l.strip()]
    rows, candidates = [], []
    for line in lines:
        m = re.match(r"^(?:-\s*)?(-?\d+(?:\.\d+)?)", line)
        if not m:
            continue
        number = float(m.group(1))
        value = number / divisor
        if number.is_integer() and value.is_integer():
            candidates.append(int(value))
            rows.append({"original_line": line, "parsed_integer": int(number), "transformed_value": value})
        else:
            rows.append({"original_line": line, "parsed_integer": None, "transformed_value": value,
                         "is_prime": False, "factor": None, "reason": "Not an integer"})
    with open("candidates.json", "w", encoding="utf-8") as f:
        json.dump(candidates, f)
    checked = json.loads(subprocess.run(
        ["python3", os.path.join(SKILL, "scripts", "check_primes.py"), "candidates.json"],
        check=True, capture_output=True, text=True).stdout)
    for row in rows:
        if row["parsed_integer"] is None:
            continue
        verdict = checked.get(str(int(row["transformed_value"])), {})
        row["is_prime"] = bool(verdict.get("is_prime"))
        row["factor"] = verdict.get("factor")
        row["reason"] = "Prime" if row["is_prime"] else f"Divisible by {row['factor']}"
    primes = sorted({int(r["transformed_value"]) for r in rows if r.get("is_prime")})
    answer({
        "primes_file_path": write("primes.md", "# Primes\n\n" + "".join(f"- {p}\n" for p in primes)),
        "results_file_path": write("results.json", json.dumps(rows, indent=2)),
    })


def bible_verse(prompt):
    language = params(prompt).get("language", "English")
    text = "For God so loved the world, that he gave his only begotten Son."
    answer({
        "text_file_path": write("text.md", f"> {text} ({language})\n\n-- John 3:16\n"),
        "info_file_path": write("info.json", json.dumps({
            "book": "John", "chapter": "3", "verse": "16", "text_en": text, "text_localized": text})),
    })


def pandas_stats(prompt):
    m = re.search(r"column `([^`]+)`", prompt)
    column = m.group(1) if m else params(prompt).get("column", "value")
    csv_path = os.path.join("uploads", "csv_file")
    run = subprocess.run(["python3", os.path.join(SKILL, "scripts", "analyze.py"), csv_path, column],
                         capture_output=True, text=True)
    if run.returncode == 0:
        print(run.stdout.strip())
        return
    values = []
    with open(csv_path, encoding="utf-8") as f:
        for row in csv.DictReader(f):
            try:
                values.append(float(row[column]))
            except (TypeError, ValueError):
                pass  # as pandas: a row without a number is NaN, left out of the mean
    answer({"mean": round(sum(values) / len(values), 2)})


def from_schema(prompt):
    with open(os.path.join(SKILL, "assets", "runner.json"), encoding="utf-8") as f:
        runner = json.load(f)
    with open(os.path.join(SKILL, runner["schemas"]["output"]), encoding="utf-8") as f:
        output = json.load(f)
    uploads = sorted(os.listdir("uploads")) if os.path.isdir("uploads") else []
    plain = {"string": "stub", "integer": 0, "number": 0, "boolean": False, "array": [], "object": {}}
    result = {}
    for name, spec in output.get("properties", {}).items():
        if spec.get("x-type") in ("artifact", "file"):
            filename = spec.get("x-filename") or name
            if filename.endswith(".json"):
                body = json.dumps({"skill": runner["id"], "uploads": uploads})
            else:
                body = f"# {runner['id']} (stub engine)\n\nuploads: {', '.join(uploads)}\n\n{prompt}\n"
            result[name] = write(filename, body)
        elif name in output.get("required", []):
            result[name] = plain.get(spec.get("type"), "stub")
    answer(result)


SKILLS = {
    "demo-prime-number": prime_number,
    "demo-bible-verse": bible_verse,
    "demo-pandas-stats": pandas_stats,
    "demo-bad-output": lambda _: answer({"message": "no result, as the skill says"}),
    "demo-missing-artifacts": lambda _: answer({"result_artifact": ""}),
    "demo-missing-result": lambda _: None,
}


def main():
    prompt = sys.argv[-1] if len(sys.argv) > 1 else ""
    with open(os.path.join(SKILL, "assets", "runner.json"), encoding="utf-8") as f:
        skill_id = json.load(f)["id"]
    os.makedirs("artifacts", exist_ok=True)
    SKILLS.get(skill_id, from_schema)(prompt)


if __name__ == "__main__":
    main()
