#!/usr/bin/env python3
"""Runs the upstream Skill Runner's own container e2e runner against us.

leike0813/Skill-Runner ships tests/e2e/run_container_e2e_tests.py, which
drives any Skill Runner server through its REST API (skills, engines and
models, jobs or temporary skill runs, upload, status, result, artifacts,
bundle; with --debug the newer runners fetch /bundle/debug) for every
suite in its suites directory. This script runs it, suite by suite,
against `tuixiu-sandbox skills serve`. Upstream's code is never copied
into this repository: give a checkout or git directory of it (e.g. the
one the `fetch` tool made) and a commit; the runner, its suites and
fixtures are exported from there into a temporary directory, which is
removed at the end (with the server's data), unless --keep.

The server gets:
* the engine `gemini` (the runner's default engine) replaced by a stub
  engine (scripts/upstream-e2e/stub-engine.py: does what each fixture
  skill's SKILL.md tells its agent, so the suites that expect a failure
  get one for the skill's reason) with the model list ["stub-model"], run
  in the sandbox like any engine;
* a stand-in for upstream's `literature-digest` skill
  (scripts/upstream-e2e/literature-digest), which its installed-skill
  suite names but its repository does not contain (a git submodule),
  also installed as `literature-analysis`, the name newer suites use.

Upstream's fixtures are patched in the exported copy, and only for these
bugs of their own (each patch applied is printed):

1. `execution_modes` missing from a fixture's runner.json (the fixtures
   at 70da26f): set to ["auto"]. Upstream's own package validator at that
   commit requires the field, so its temporary-run suites cannot pass
   against upstream either; its later fixtures add exactly this value.
2. `engines` missing (the fixtures from 601ec81 on): set to
   ["gemini", "codex", "iflow"], the list they had before. The runner
   takes a fixture's declared `engines` as the allowed ones and expects
   an engine-mismatch 400 when there are none, while upstream's server
   (and this one) lets a skill without the list run on every engine, so
   every temporary-run suite fails its own check.

    upstream-e2e.py --upstream DIR [--commit REV] [--bin target/debug/tuixiu-sandbox]
                    [--suite NAME]... [--python PY] [--debug] [--keep]

Prints one line per suite (PASS, or the runner's last error line and the
end of its output), and the count. `--python` names an interpreter that
has httpx and PyYAML; otherwise a virtualenv is made in the temporary
directory and they are installed from PyPI. Exit status 0 when every
selected suite passed.
"""
import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "scripts", "upstream-e2e")
# The upstream commit whose protocol docs/skills.md follows (docs/skills.md,
# "Upstream's own e2e runner").
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


def patch_fixtures(tree):
    """The two fixture patches of the module docstring; returns what was done."""
    done = []
    for path in sorted(glob.glob(os.path.join(tree, "tests", "fixtures", "skills", "*", "assets", "runner.json"))):
        with open(path, encoding="utf-8") as f:
            runner = json.load(f)
        skill = os.path.basename(os.path.dirname(os.path.dirname(path)))
        changed = []
        if "execution_modes" not in runner:
            runner["execution_modes"] = ["auto"]
            changed.append('execution_modes=["auto"]')
        if not runner.get("engines") and "unsupported_engines" not in runner:
            runner["engines"] = ["gemini", "codex", "iflow"]
            changed.append('engines=["gemini","codex","iflow"]')
        if changed:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(runner, f, indent=2)
            done.append(f"{skill}: {', '.join(changed)}")
    return done


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
    skills = os.path.join(work, "skills")
    data = os.path.join(work, "data")
    os.makedirs(skills)
    subprocess.run(["cp", "-r", os.path.join(HERE, "literature-digest"), skills], check=True)
    # Newer runners name the same submodule skill literature-analysis.
    stand_in = os.path.join(skills, "literature-analysis")
    shutil.copytree(os.path.join(skills, "literature-digest"), stand_in)
    for rel in ("SKILL.md", "assets/runner.json"):
        path = os.path.join(stand_in, rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace("literature-digest", "literature-analysis"))
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
        server.wait()
        with open(log_path) as f:
            sys.exit(f"upstream-e2e: the server did not start: {line!r}\n{f.read()}")
    return server, line.removeprefix("listening on ")


def run_suite(py, runner, base_url, suite_file, work, debug):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": work,
           "E2E_DOWNLOAD_DIR": os.path.join(work, "downloads")}
    argv = [py, runner, "--base-url", base_url, "-e", "gemini", "-v", "-k", suite_file]
    if debug:
        argv.append("--debug")
    try:
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    except subprocess.TimeoutExpired:
        return False, "timed out after 600 s", ""
    text = out.stdout + out.stderr
    lines = [l for l in text.splitlines() if l.strip()]
    if out.returncode == 0:
        last = [l for l in out.stdout.splitlines() if l.strip()]
        return True, last[-1] if last else "", text
    return False, lines[-1] if lines else f"exit {out.returncode}", text


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", required=True, help="checkout or git directory of leike0813/Skill-Runner")
    ap.add_argument("--commit", default=DEFAULT_COMMIT)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "tuixiu-sandbox"))
    ap.add_argument("--suite", action="append", default=[], help="suite file name (repeatable; default all)")
    ap.add_argument("--python", help="an interpreter with httpx and PyYAML")
    ap.add_argument("--debug", action="store_true", help="the runner's --debug (debug bundles)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (runner output, server data)")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="tuixiu-upstream-e2e-")
    os.chmod(work, 0o755)
    server = None
    # SIGTERM ends the run as Ctrl-C does: through the cleanup below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    failed = 0
    try:
        tree = os.path.join(work, "upstream")
        os.makedirs(tree)
        runner = export(args.upstream, args.commit, tree)
        for patch in patch_fixtures(tree):
            print(f"fixture patch: {patch}")
        suites = sorted(args.suite or os.listdir(suites_dir(tree)))
        py = python_with_deps(args.python, work)
        server, addr = start_server(os.path.abspath(args.bin), work)
        print(f"upstream {args.commit[:12]}, server http://{addr}")
        for suite in suites:
            ok, last, text = run_suite(py, runner, f"http://{addr}", suite, work, args.debug)
            failed += not ok
            print(f"{'PASS' if ok else 'FAIL'} {suite}: {last}")
            if not ok:
                print("  | " + "\n  | ".join(text.splitlines()[-15:]))
        print(f"{len(suites) - failed}/{len(suites)} suites passed")
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        if args.keep:
            print(f"kept: {work} (server.log, data/, downloads/)")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
