#!/usr/bin/env python3
"""Runs the upstream Skill Runner's own container e2e runner against us.

leike0813/Skill-Runner ships tests/e2e/run_container_e2e_tests.py, which
drives any Skill Runner server through its REST API (skills, engines and
models, jobs or temporary skill runs, upload, status, result, artifacts,
bundle) for every suite in its tests/suites/. This script runs it, suite by
suite, against `tuixiu-sandbox skills serve`. Upstream's code is never
copied into this repository: give a checkout or git directory of it (e.g.
the one the `fetch` tool made) and a commit; the runner, its suites and
fixtures are exported from there into a temporary directory.

The server gets:
* the engine `gemini` (the runner's default engine) replaced by a stub
  engine (scripts/upstream-e2e/stub-engine.py: writes every artifact the
  skill's output schema declares and answers with their paths), with the
  model list ["stub-model"], run in the sandbox like any engine;
* a stand-in for upstream's `literature-digest` skill
  (scripts/upstream-e2e/literature-digest), which its installed-skill
  suite names but its repository does not contain (a git submodule).

    upstream-e2e.py --upstream DIR [--commit REV] [--bin target/debug/tuixiu-sandbox]
                    [--suite NAME]... [--python PY]

Prints one line per suite (PASS, or the runner's last error line) and the
server's address, data directory and log. `--python` names an interpreter
that has httpx and PyYAML; otherwise a virtualenv is made and they are
installed from PyPI. Exit status 0 when every selected suite passed.
"""
import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "scripts", "upstream-e2e")
# The upstream commit whose protocol docs/skills.md follows (reference REF).
DEFAULT_COMMIT = "70da26fa80cab5962a7bd5205f16c9e41ac5b9f9"
RUNNER = "tests/e2e/run_container_e2e_tests.py"


def git_dir(path):
    dot_git = os.path.join(path, ".git")
    return dot_git if os.path.exists(dot_git) else path


def export(upstream, commit, dest):
    """`git archive` of the runner, its suites and fixtures."""
    archive = subprocess.run(
        ["git", f"--git-dir={git_dir(upstream)}", "archive", commit, "tests"],
        check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    runner = os.path.join(dest, RUNNER)
    if not os.path.isfile(runner):
        sys.exit(f"upstream-e2e: {RUNNER} is not in {upstream} at {commit}")
    return runner


def suites_dir(upstream_tree):
    # The runner moved its suites at 7d8914d.
    for rel in ("tests/suites", "tests/engine_integration/suites"):
        path = os.path.join(upstream_tree, rel)
        if os.path.isdir(path):
            return path
    sys.exit("upstream-e2e: no suites directory in the exported tree")


def python_with_deps(given, work):
    if given:
        return given
    venv = os.path.join(work, "venv")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    py = os.path.join(venv, "bin", "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "httpx", "pyyaml"], check=True)
    return py


def start_server(binary, work):
    import json
    skills = os.path.join(work, "skills")
    data = os.path.join(work, "data")
    os.makedirs(skills)
    subprocess.run(["cp", "-r", os.path.join(HERE, "literature-digest"), skills], check=True)
    engines = os.path.join(work, "engines.json")
    with open(engines, "w") as f:
        json.dump({"engines": {"gemini": {
            "argv": ["python3", "/engine/stub-engine.py", "{prompt}"],
            "ro_binds": [{"src": HERE, "dst": "/engine"}],
            "network": "off",
            "models": ["stub-model"],
        }}}, f)
    log_path = os.path.join(work, "server.log")
    log = open(log_path, "w")
    server = subprocess.Popen(
        [binary, "skills", "serve", "--skills-dir", skills, "--data-dir", data,
         "--listen", "127.0.0.1:0", "--engines", engines, "--temp-skills"],
        stdout=subprocess.PIPE, stderr=log, text=True)
    line = server.stdout.readline().strip()
    if not line.startswith("listening on "):
        server.kill()
        sys.exit(f"upstream-e2e: the server did not start: {line!r}; see {log_path}")
    return server, line.removeprefix("listening on "), data, log_path


def run_suite(py, runner, base_url, suite_file, work):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": work,
           "E2E_DOWNLOAD_DIR": os.path.join(work, "downloads")}
    try:
        out = subprocess.run(
            [py, runner, "--base-url", base_url, "-e", "gemini", "-v", "-k", suite_file],
            capture_output=True, text=True, env=env, timeout=600)
    except subprocess.TimeoutExpired:
        return False, "timed out after 600 s", ""
    text = out.stdout + out.stderr
    if out.returncode == 0:
        last = [l for l in out.stdout.splitlines() if l.strip()]
        return True, last[-1] if last else "", text
    lines = [l for l in text.splitlines() if l.strip()]
    return False, lines[-1] if lines else f"exit {out.returncode}", text


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", required=True, help="checkout or git directory of leike0813/Skill-Runner")
    ap.add_argument("--commit", default=DEFAULT_COMMIT)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "tuixiu-sandbox"))
    ap.add_argument("--suite", action="append", default=[], help="suite file name (repeatable; default all)")
    ap.add_argument("--python", help="an interpreter with httpx and PyYAML")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="tuixiu-upstream-e2e-")
    os.chmod(work, 0o755)
    tree = os.path.join(work, "upstream")
    os.makedirs(tree)
    runner = export(args.upstream, args.commit, tree)
    suites = sorted(args.suite or os.listdir(suites_dir(tree)))
    py = python_with_deps(args.python, work)
    server, addr, data, log_path = start_server(os.path.abspath(args.bin), work)
    failed = 0
    try:
        print(f"upstream {args.commit[:12]}, server http://{addr}, data {data}, log {log_path}")
        for suite in suites:
            ok, last, text = run_suite(py, runner, f"http://{addr}", suite, work)
            with open(os.path.join(work, f"{suite}.log"), "w") as f:
                f.write(text)
            failed += not ok
            print(f"{'PASS' if ok else 'FAIL'} {suite}: {last}")
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(f"runner output per suite: {work}/<suite>.log")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
