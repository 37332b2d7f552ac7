#!/usr/bin/env python3
"""A stub engine for scripts/upstream-e2e.py, run inside the job's sandbox.

It obeys the engine contract (the prompt is the last argument, the
working directory is the run directory /workspace, files go to
artifacts/, the answer is JSON on stdout) without a model: it reads the
skill's output schema from the package (/skill), writes one file per
artifact property (x-type artifact or file) and answers with their paths,
and with a plain value of the declared type for every other required
property.
"""
import json
import os
import sys

SKILL = "/skill"


def main():
    prompt = sys.argv[-1] if len(sys.argv) > 1 else ""
    with open(os.path.join(SKILL, "assets", "runner.json"), encoding="utf-8") as f:
        runner = json.load(f)
    with open(os.path.join(SKILL, runner["schemas"]["output"]), encoding="utf-8") as f:
        output = json.load(f)
    uploads = sorted(os.listdir("uploads")) if os.path.isdir("uploads") else []
    os.makedirs("artifacts", exist_ok=True)
    plain = {"string": "stub", "integer": 0, "number": 0, "boolean": False, "array": [], "object": {}}
    answer = {}
    for name, spec in output.get("properties", {}).items():
        if spec.get("x-type") in ("artifact", "file"):
            filename = spec.get("x-filename") or name
            path = os.path.join("artifacts", filename)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                if filename.endswith(".json"):
                    json.dump({"skill": runner["id"], "uploads": uploads}, f)
                else:
                    f.write(f"# {runner['id']} (stub engine)\n\nuploads: {', '.join(uploads)}\n\n{prompt}\n")
            answer[name] = os.path.join(os.getcwd(), path)
        elif name in output.get("required", []):
            answer[name] = plain.get(spec.get("type"), "stub")
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
