#!/usr/bin/env python3
"""Writes the seed corpora in fuzz/seeds/<target>/ (committed; run again
after changing a seed here). Sources: the examples of docs/manifest.md,
docs/proxy.toml.example, the wire protocol reference
(/work/shared/reference/tuixiu-wire-protocol.md), the built-in seccomp
profiles, the skill fixture of tests/fixtures/skills and the unit tests'
command lines and zip tricks. The crashing inputs of fixed bugs are kept
next to them as crash-<what> (not written here)."""

import io
import json
import os
import warnings
import struct
import zipfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SEEDS = os.path.join(HERE, "seeds")


def put(target, name, data):
    d = os.path.join(SEEDS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def js(v):
    return json.dumps(v, ensure_ascii=False)


def read(rel):
    with open(os.path.join(REPO, rel), "rb") as f:
        return f.read()


# ---------------------------------------------------------------- manifest

DOC_EXAMPLE = {
    "agentInputs": {
        "version": 1,
        "envPatch": {"HOME": "/home/agent", "USER": "agent", "LOGNAME": "agent"},
        "items": [
            {"id": "workspace", "apply": "bindMount", "access": "rw",
             "source": {"type": "hostPath", "path": "/srv/runs/run-1"},
             "target": {"root": "WORKSPACE", "path": "."}},
            {"id": "skill:review", "apply": "downloadExtract",
             "source": {"type": "httpZip", "uri": "/api/acp-proxy/skills/packages/3f1c.zip",
                        "contentHash": "3f1c" + "0" * 60},
             "target": {"root": "USER_HOME", "path": ".codex/skills/review"}},
            {"id": "agents-md", "apply": "writeFile",
             "source": {"type": "inlineText", "text": "Always run the tests.\n"},
             "target": {"root": "USER_HOME", "path": ".codex/AGENTS.md"}},
        ],
    }
}


def manifest_seeds():
    put("manifest", "doc-example.json", js(DOC_EXAMPLE))
    put("manifest", "reference-init.json", js({
        "script": "set -euo pipefail\n", "timeout_seconds": 300,
        "env": {"FOO": "bar", "USER_HOME": "/root"},
        "agentInputs": {"version": 1, "envPatch": {"USER": "agent"}, "items": [
            {"id": "workspace", "apply": "bindMount", "access": "rw",
             "source": {"type": "hostPath", "path": "."},
             "target": {"root": "WORKSPACE", "path": "."}},
            {"id": "agents-md", "apply": "writeFile",
             "source": {"type": "inlineText", "text": "# hi"},
             "target": {"root": "USER_HOME", "path": ".codex/AGENTS.md"}}]}}))
    put("manifest", "aliases.json", js({"version": 1, "items": [
        {"id": "z", "apply": "extract", "source": {"type": "http_zip", "uri": "/z.zip"},
         "target": {"root": "SCRATCH", "path": "z"}},
        {"id": "t", "apply": "write_file", "source": {"type": "inline_text", "text": "x"},
         "target": {"root": "WORKSPACE", "path": "a\\b\\c.txt"}},
        {"id": "h", "apply": "bind_mount", "access": "ro", "source": {"type": "host_path", "path": "skills/demo"},
         "target": {"root": "USER_HOME", "path": ".codex/skills/demo"}}]}))
    # Relative to the fuzz target's allowed directory: links in and out of it.
    put("manifest", "host-paths.json", js({"version": 1, "items": [
        {"id": "ws", "apply": "bindMount", "source": {"type": "hostPath", "path": "skills"},
         "target": {"root": "WORKSPACE", "path": ""}},
        {"id": "in", "apply": "copy", "source": {"type": "hostPath", "path": "link-in/demo"},
         "target": {"root": "USER_HOME", "path": "demo"}},
        {"id": "out", "apply": "copy", "source": {"type": "hostPath", "path": "link-out/secret"},
         "target": {"root": "SCRATCH", "path": "s"}},
        {"id": "etc", "apply": "bindMount", "access": "ro", "source": {"type": "hostPath", "path": "link-etc"},
         "target": {"root": "USER_HOME", "path": "etc"}},
        {"id": "abs", "apply": "copy", "source": {"type": "hostPath", "path": "/etc/passwd"},
         "target": {"root": "WORKSPACE", "path": "passwd"}},
        {"id": "file", "apply": "copy", "source": {"type": "hostPath", "path": "notes.txt"},
         "target": {"root": "WORKSPACE", "path": "notes.txt"}}]}))
    put("manifest", "git.json", js({"version": 1, "items": [
        {"id": "repo", "apply": "checkout", "source": {"type": "git", "repo": "https://git.example/r.git", "ref": "main"},
         "target": {"root": "WORKSPACE", "path": "src"}},
        {"id": "local", "apply": "checkout", "source": {"type": "git", "repo": "file://skills"},
         "target": {"root": "SCRATCH", "path": "l"}},
        {"id": "scp", "apply": "checkout", "source": {"type": "git", "repo": "git@host:org/r.git", "ref": "v1.0"},
         "target": {"root": "USER_HOME", "path": "r"}}]}))
    put("manifest", "escape.json", js({"version": 1, "envPatch": {"HOME": "/etc"}, "items": [
        {"id": "x", "apply": "writeFile", "source": {"type": "inlineText", "text": "x"},
         "target": {"root": "WORKSPACE", "path": "../../etc/passwd"}}]}))
    put("manifest", "bad-version.json", js({"version": "1", "items": []}))
    put("manifest", "bad-env.json", js({"version": 1, "env": {"A": "1"}, "items": []}))


# ---------------------------------------------------------------- zip

def zip_bytes(entries):
    """entries: (name, data or None for a dir, mode, method)"""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data, mode, method in entries:
            info = zipfile.ZipInfo(name)
            info.create_system = 3
            info.compress_type = method
            if data is None:
                info.external_attr = (0o040755 << 16) | 0x10
                z.writestr(info, b"")
            else:
                info.external_attr = mode << 16
                z.writestr(info, data)
    return buf.getvalue()


S, D = zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED


def zip_seeds():
    raw = lambda name, b: put("zip_extract", name, b"\x00" + b)
    raw("skill.zip", zip_bytes([
        ("review/", None, 0, S),
        ("review/SKILL.md", b"---\nname: review\n---\n", 0o100644, D),
        ("review/bin/run.sh", b"#!/bin/sh\necho hi\n", 0o100755, D),
        ("review/notes.txt", b"plain", 0o100644, S)]))
    for name, entry in [("dotdot", "../evil"), ("absolute", "/etc/evil"), ("backslash", "..\\evil"),
                        ("drive", "C:/evil"), ("nested-dotdot", "a/b/../../../evil"), ("control", "a\nb")]:
        raw(name + ".zip", zip_bytes([(entry, b"x", 0o100644, S)]))
    raw("symlink.zip", zip_bytes([("link", b"/etc/passwd", 0o120777, S), ("link/x", b"x", 0o100644, S)]))
    raw("fifo.zip", zip_bytes([("pipe", b"", 0o010644, S)]))
    raw("setuid.zip", zip_bytes([("suid", b"x", 0o104755, S)]))
    raw("file-then-dir.zip", zip_bytes([("a", b"x", 0o100644, S), ("a/b", b"y", 0o100644, S)]))
    raw("too-large.zip", zip_bytes([("zeros", b"\0" * (1 << 20) + b"!", 0o100644, D)]))
    raw("many.zip", zip_bytes([(f"f{i}", b"", 0o100644, S) for i in range(70)]))
    # A local header and central directory that say 4 bytes for 64 of data.
    lie = bytearray(zip_bytes([("lie.txt", b"A" * 64, 0o100644, D)]))
    data = zlib.compress(b"A" * 64)
    for sig, off in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        i = lie.find(sig)
        struct.pack_into("<I", lie, i + off, 4)
    raw("size-lie.zip", bytes(lie))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw("duplicate.zip", zip_bytes([("d", b"1", 0o100644, S), ("d", b"2", 0o100644, S)]))
    # Structured form (first byte odd): kind, name length, name, content spec.
    def entry(kind, name, content=b""):
        n = name.encode()
        out = bytes([kind, len(n)]) + n
        if kind % 4 in (0, 1):
            out += bytes([len(content), 0]) + content
        return out
    put("zip_extract", "structured-tree", b"\x01" + entry(2, "dir/") + entry(0x10, "dir/a.txt", b"hello")
        + entry(0x21, "dir/x.sh", b"#!/bin/sh\n") + entry(3, "dir/l") + b"\x04" + b"/etc")
    put("zip_extract", "structured-escape", b"\x01" + entry(0, "../up", b"u") + entry(0, "/abs", b"a"))
    put("zip_extract", "structured-bomb", b"\x01" + bytes([0x10, 1]) + b"z" + bytes([0xa0, 0]))


# ---------------------------------------------------------------- proxy

def open_msg(run, init, **kw):
    m = {"type": "acp_open", "run_id": run, "cwd": "/workspace", "init": init,
         "instance_name": f"tuixiu-run-{run}", "keepalive_ttl_seconds": 600}
    m.update(kw)
    return m


INIT = {"script": "", "timeout_seconds": 300,
        "env": {"FOO": "bar", "OPENAI_API_KEY": "sk-secret-123456", "USER_HOME": "/root",
                "TUIXIU_RUN_BRANCH": "run/x", "TUIXIU_WORKSPACE_GUEST": "/workspace"},
        "agentInputs": {"version": 1, "envPatch": {"USER": "agent"}, "items": [
            {"id": "workspace", "apply": "bindMount", "access": "rw",
             "source": {"type": "hostPath", "path": "@ROOT@/run-r1"},
             "target": {"root": "WORKSPACE", "path": "."}},
            {"id": "agents-md", "apply": "writeFile",
             "source": {"type": "inlineText", "text": "# hi"},
             "target": {"root": "USER_HOME", "path": ".codex/AGENTS.md"}}]}}


def lines(*msgs):
    return "\n".join(m if isinstance(m, str) else js(m) for m in msgs).encode()


def proxy_seeds():
    put("proxy_messages", "open-prompt-close.txt", lines(
        open_msg("r1", INIT),
        {"type": "prompt_send", "run_id": "r1", "prompt_id": "p1", "cwd": "/workspace", "session_id": None,
         "instance_name": "tuixiu-run-r1", "keepalive_ttl_seconds": 600, "context": "ctx",
         "prompt": [{"type": "text", "text": "hi"}], "timeout_ms": 3600000},
        {"type": "session_cancel", "run_id": "r1", "control_id": "c1", "session_id": "s1"},
        {"type": "session_set_mode", "run_id": "r1", "control_id": "c2", "session_id": "s1", "mode_id": "m"},
        {"type": "session_set_config_option", "run_id": "r1", "control_id": "c3", "session_id": "s1",
         "config_id": "k", "value": 1},
        {"type": "session_permission", "run_id": "r1", "session_id": "s1", "request_id": "7",
         "outcome": "selected", "option_id": "allow"},
        {"type": "acp_message", "run_id": "r1", "message": {"jsonrpc": "2.0", "id": 1, "method": "x"}},
        {"type": "acp_close", "run_id": "r1"}))
    put("proxy_messages", "controls.txt", lines(
        open_msg("r2", INIT),
        {"type": "sandbox_control", "action": "report_inventory",
         "expected_instances": [{"instance_name": "tuixiu-run-xyz", "run_id": None}]},
        {"type": "sandbox_control", "action": "gc", "request_id": "g1",
         "expected_instances": [{"instance_name": "tuixiu-run-r2", "run_id": "r2"}], "dry_run": True},
        {"type": "sandbox_control", "action": "gc", "dry_run": False,
         "gc": {"remove_orphans": True, "remove_workspaces": True, "max_delete_count": 500}},
        {"type": "sandbox_control", "action": "prune_orphans", "request_id": "p1", "expected_instances": []},
        {"type": "sandbox_control", "instance_name": "tuixiu-run-r2", "action": "inspect"},
        {"type": "sandbox_control", "action": "remove_image", "image": "alpine:3"},
        {"type": "sandbox_control", "run_id": "r2", "instance_name": "tuixiu-run-r2", "action": "stop"},
        {"type": "sandbox_control", "run_id": "r2", "action": "ensure_running"},
        {"type": "sandbox_control", "run_id": "r2", "action": "remove_workspace", "request_id": "w1"},
        {"type": "sandbox_control", "run_id": "r2", "action": "remove"},
        {"type": "sandbox_control", "action": "git_push", "request_id": "g2", "run_id": "r2",
         "branch": "run/x", "cwd": "/workspace", "env": {"GH_TOKEN": "t"}, "timeout_seconds": 300},
        {"type": "sandbox_control", "action": "nope"}))
    put("proxy_messages", "escapes.txt", lines(
        open_msg("r3", {**INIT, "agentInputs": {"version": 1, "items": [
            {"id": "workspace", "apply": "bindMount", "source": {"type": "hostPath", "path": "@OUT@"},
             "target": {"root": "WORKSPACE", "path": "."}}]}}),
        open_msg("r4", {"env": {"TUIXIU_WORKSPACE": "@ROOT@/../outside", "HOME": "/workspace/x"},
                        "agentInputs": {"version": 1, "items": []}}),
        open_msg("out", {"env": {"TUIXIU_WORKSPACE": "@ROOT@/run-out/sub"}, "agentInputs": {"version": 1, "items": []}}),
        {"type": "sandbox_control", "run_id": "out", "action": "remove_workspace"},
        {"type": "sandbox_control", "instance_name": "tuixiu-run-out", "action": "remove_workspace"},
        {"type": "acp_open", "run_id": "../x"},
        {"type": "acp_open", "run_id": "a:b", "init": "not an object"},
        {"type": "prompt_send", "run_id": "r5", "prompt_id": "p", "prompt": "not an array"},
        {"type": "acp_close", "run_id": 5}))
    put("proxy_messages", "misc.txt", lines(
        {"type": "register_ack", "success": True},
        {"type": "register_ack", "success": False, "error": "proxy_id_conflict"},
        {"type": "proxy_id_taken_over", "message": "in use"},
        {"type": "error", "code": "x", "message": "y"},
        {"type": "unknown"}, "[1]", "{", '{"type":3}'))

    put("proxy_config", "example.toml", read("docs/proxy.toml.example"))
    put("proxy_config", "minimal.toml",
        'orchestrator_url = "ws://127.0.0.1:1/ws/agent"\n[sandbox]\nworkspaceHostRoot = "/x"\n')
    put("proxy_config", "env.toml",
        'orchestrator_url = "wss://b.example/ws"\nheartbeat_seconds_typo = 3\n[sandbox]\nworkspaceHostRoot = "/x"\n'
        'provider = "container_oci"\nimage = "tuixiu/agent:1"\nnetwork = "off"\n[[sandbox.volumes]]\n'
        'hostPath = "/srv/c.toml"\nguestPath = "/root/.codex/config.toml"\nreadOnly = true\n'
        '[sandbox.secretFiles]\nopenai = "/nonexistent/key"\n[sandbox.bootstrap]\ncheckCommand = ["true"]\n'
        '#env\nACP_PROXY_HEARTBEAT_SECONDS=7\nACP_PROXY_AGENT_ENV_ALLOWLIST=A, B C\n'
        'ACP_PROXY_AUTH_TOKEN=tok-123456\nACP_PROXY_SANDBOX_PATH_MAPPING=windows_to_wsl\n')


# ---------------------------------------------------------------- acp

def rpc(id_, method, params=None):
    m = {"jsonrpc": "2.0", "method": method}
    if id_ is not None:
        m["id"] = id_
    if params is not None:
        m["params"] = params
    return m


def acp_seeds():
    put("acp_transport", "client-requests.txt", b"\x00" + lines(
        rpc(1, "fs/read_text_file", {"sessionId": "s", "path": "/workspace/src/a.txt", "line": 2, "limit": 1}),
        rpc(2, "fs/write_text_file", {"sessionId": "s", "path": "/workspace/new/f.txt", "content": "hi"}),
        rpc("a", "fs/read_text_file", {"path": "/workspace/new/f.txt"}),
        rpc(None, "session/update", {"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk",
                                                                  "content": {"type": "text", "text": "hi"}}}),
        rpc(3, "session/request_permission", {"sessionId": "s", "toolCall": {"toolCallId": "t"}, "options": [
            {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
            {"optionId": "no", "name": "Reject", "kind": "reject_once"}]}),
        rpc(4, "terminal/create", {"sessionId": "s", "command": "ls", "args": ["-l"], "cwd": "/workspace",
                                   "env": [{"name": "A", "value": "1"}], "outputByteLimit": 1000}),
        rpc(5, "terminal/output", {"sessionId": "s", "terminalId": "t1"}),
        rpc(6, "_vendor/thing", {}),
        rpc(None, "$/cancel_request", {"requestId": 3}),
        rpc(None, "_vendor/notice", {"x": 1}),
        {"jsonrpc": "2.0", "id": 1, "result": {}},
        "[1,2]", "not json", '{"jsonrpc":"2.0","id":7,"id":8,"method":"fs/read_text_file"}'))
    put("acp_transport", "escapes.txt", b"\x02" + lines(
        rpc(1, "fs/read_text_file", {"path": "/etc/secret"}),
        rpc(2, "fs/read_text_file", {"path": "/workspace/etc-link/secret"}),
        rpc(3, "fs/read_text_file", {"path": "/workspace/up"}),
        rpc(4, "fs/write_text_file", {"path": "/workspace/up-dir/secret", "content": "x"}),
        rpc(5, "fs/write_text_file", {"path": "/home/agent/.config/out/secret", "content": "x"}),
        rpc(6, "terminal/create", {"command": "sh", "cwd": "/workspace/etc-link"}),
        rpc(7, "fs/read_text_file", {"path": "/home/agent/root/secret"}),
        rpc(8, "session/request_permission", {"sessionId": "s", "options": [{"optionId": "o", "kind": "allow_always"}]})))
    fs_ops = [
        "r /workspace/src/a.txt 2 1", "r /workspace/rel", "r /workspace/abs", "r /workspace/up",
        "r /workspace/etc-link/secret", "r /workspace/magic/secret", "r /workspace/loop",
        "r /home/agent/root/secret", "r /home/agent/.config/out/secret", "w /workspace/new/dir/f hi",
        "w /workspace/up-dir/secret pwned", "w /workspace/home/.profile x", "w /home/agent/ws/src/b y",
        "d /workspace/new/../src", "d /workspace/etc-link", "d /home/agent/root",
        "l /workspace/evil /outside", "r /workspace/evil/deep/secret", "w /workspace/evil/deep/secret x",
        "m /workspace/m", "l /workspace/m/up ../..", "w /workspace/m/up/secret x", "f /home/agent/f"]
    put("acp_fs", "tree.txt", b"\x00" + "\n".join(fs_ops).encode())
    put("acp_fs", "volumes.txt", b"\x01" + "\n".join(fs_ops).encode())


# ---------------------------------------------------------------- seccomp

def seccomp_seeds():
    for name in ("default", "strict"):
        put("seccomp_profile", f"{name}.json", b"\x00" + read(f"seccomp-profiles/{name}.json"))
        put("seccomp_profile", f"{name}-ptrace-unix.json", b"\x05" + read(f"seccomp-profiles/{name}.json"))
    put("seccomp_profile", "doc-example.json", b"\x02" + js({
        "defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
            {"names": ["unshare", "setns"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1},
            {"names": ["ioctl"], "action": "SCMP_ACT_ERRNO",
             "args": [{"index": 1, "value": 4294967295, "valueTwo": 21522, "op": "SCMP_CMP_MASKED_EQ"}]}]}).encode())
    put("seccomp_profile", "conditions.json", b"\x08" + js({
        "defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38, "archMap": [], "flags": [], "syscalls": [
            {"names": ["read"], "action": "SCMP_ACT_ERRNO", "includes": {"arches": ["arm64"]}},
            {"names": ["write"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
            {"names": ["close"], "action": "SCMP_ACT_ALLOW", "excludes": {"caps": ["CAP_SYS_ADMIN"]}},
            {"names": ["dup"], "action": "SCMP_ACT_TRAP", "includes": {"minKernel": "5.10"}},
            {"name": "socket", "action": "SCMP_ACT_ALLOW",
             "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_EQ"}, {"index": 1, "value": 3, "op": "SCMP_CMP_LE"}]},
            {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
             "args": [{"index": 0, "value": 2114060288, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]},
            {"names": ["mmap"], "action": "SCMP_ACT_LOG", "args": [{"index": 2, "value": 4, "op": "SCMP_CMP_GT"}]},
            {"names": ["kill"], "action": "SCMP_ACT_KILL_PROCESS"},
            {"names": ["tkill"], "action": "SCMP_ACT_KILL", "comment": "x"}]}).encode())


# ---------------------------------------------------------------- skills

def skills_seeds():
    fx = "tests/fixtures/skills/tuixiu-demo/assets/"
    parts = [read(fx + f).decode() for f in
             ("runner.json", "input.schema.json", "parameter.schema.json", "output.schema.json")]
    body = js({"skill_id": "@SKILL@", "engine": "codex", "input": {"query": "q"}, "parameter": {"mode": "ok"},
               "runtime_options": {"execution_mode": "auto", "no_cache": True}})
    uploads = "f input_file\nl query /etc/passwd\nd other"
    put("skills_request", "demo.txt", "\n----\n".join(parts + [body, uploads]))
    runner = json.loads(parts[0])
    runner["schemas"]["input"] = "../../outside.schema.json"
    runner["schemas"]["parameter"] = "assets/link.schema.json"
    put("skills_request", "escape.txt", "\n----\n".join([js(runner)] + parts[1:] + [
        js({"skill_id": "../x", "engine": "gemini", "input": {"input_file": "x"}, "model": 5}), "l input_file ../x"]))
    runner = json.loads(parts[0])
    runner.update({"engines": ["codex", "nope"], "unsupported_engines": ["iflow"], "version": "2.0rc1",
                   "execution_modes": ["auto", "interactive"],
                   "artifacts": [{"role": "r", "pattern": "out/*.md", "required": True}]})
    put("skills_request", "engines.txt", "\n----\n".join([js(runner)] + parts[1:] + [
        js({"skill_id": "@SKILL@", "engine": "iflow", "runtime_options": {"execution_mode": "interactive",
                                                                          "bogus": 1}}), "f input_file"]))

    sep = "\n----\n"
    ask = {"session_id": "s1", "ask_user": {"interaction_id": 1, "kind": "choose_one", "prompt": "Which format?",
                                            "options": [{"label": "Markdown", "value": "md"}, {"label": "Text"}]}}
    waiting = {"profile": "resumable", "pending": {"interaction_id": 1}, "replies": [
        {"interaction_id": 1, "idempotency_key": "k", "response": "md", "resolution_mode": "user_reply",
         "resolved_at": "2026-01-01T00:00:00.000Z"}]}
    put("skills_reply", "take.txt", sep.join([js({"interaction_id": 1, "response": "md"}),
                                              "stdout_from=10&stderr_from=0", js(ask), js(waiting) + "\x02"]))
    put("skills_reply", "replay.txt", sep.join([js({"interaction_id": "1", "response": "md", "idempotency_key": "k"}),
                                                "stdout_from=-1", js({"outcome": "final", "final_data": {"a": "é"}}),
                                                js(waiting) + "\x01"]))
    put("skills_reply", "sticky.txt", sep.join([js({"interaction_id": 2, "response": {"ok": True}}), "x=y",
                                                js({"action": "ask_user", "interaction": {"interaction_id": "2", "question": " Go on? ", "kind": "confirmation"}}),
                                                js({"profile": "sticky_process", "pending": {"interaction_id": 2}}) + "\x08"]))
    put("skills_answer", "codex.txt", b"\x00" + (
        '{"type":"thread.started"}\n{"type":"item.completed","item":{"type":"agent_message",'
        '"text":"{\\"summary_path\\":\\"artifacts/summary.md\\"}"}}\n').encode())
    put("skills_answer", "gemini.txt", b"\x01" + b'{"response":"```json\\n{\\"a\\": 1}\\n```"}')
    put("skills_answer", "gemini-error.txt", b"\x01" + b'{"error":{"message":"quota"}}')
    put("skills_answer", "text.txt", b"\x02" + b'Done.\n```json\n{"a": "}"}\n```\nx {"b": {"c": "{"}} y')


# ---------------------------------------------------------------- launcher

TAKEN = [
    ["--", "true"],
    ["sh", "-c", "id; pwd", "--workspace", "x"],
    ["--workspace=/tmp/ws", "--home", "/tmp/h", "--", "codex-acp", "--flag"],
    ["-v", "--user", "agent", "--uid", "1000", "--gid", "100", "--", "id"],
    ["-vv", "--verbose", "--user=bob", "--home-path", "/home/b", "--chdir", "/workspace/sub", "--", "ls"],
    ["--ro-bind", "/a", "/b", "--tmpfs", "/t", "--bind", "/c", "/d", "--ro-bind", "/e", "/f", "--", "x"],
    ["--env", "A=1", "--env=B=2", "--pass-env", "TERM", "--pass-env=HOME", "--", "env"],
    ["--network", "off", "--seccomp", "strict", "--allow-ptrace", "--landlock", "require", "--", "x"],
    ["--nofile", "1024", "--timeout", "30s", "--kill-after", "2s", "--hostname", "box", "--", "x"],
    ["--map-gid=99", "--json-status-fd", "3", "--keep-session", "--", "x"],
    ["--env-file", "/e1", "--env-file=/e2", "--env-allow", "K", "--no-default-env-allow", "--", "x"],
    ["--memory", "512m", "--pids", "100", "--cpus", "1.5", "--", "x"],
    ["--cpus=2", "--memory=1G", "x", "--memory", "2G"],
    ["--manifest", "m.json", "--provider", "docker", "x"],
]


def launcher_seeds():
    for i, args in enumerate(TAKEN):
        put("launcher_args", f"taken-{i:02}", b"\0".join(a.encode() for a in args))


# bubblewrap command lines as consumers write them (bwrap_args): codex's
# sandbox and its probe, Flatpak's run line, and the rest of the options.
BWRAP_LINES = {
    "codex": ["--new-session", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev", "--bind", "/work",
              "/work", "--ro-bind", "/work/.git", "/work/.git", "--unshare-user", "--unshare-pid",
              "--unshare-net", "--proc", "/proc", "--", "codex-linux-sandbox", "--", "bash", "-lc", "ls"],
    "codex-probe": ["--ro-bind", "/", "/", "--dev", "/dev", "--unshare-user", "--unshare-pid", "--unshare-net",
                    "--proc", "/proc", "--", "true"],
    "flatpak": ["--args", "3", "--level-prefix", "--unshare-ipc", "--unshare-pid", "--unshare-cgroup-try",
                "--die-with-parent", "--as-pid-1", "--info-fd", "4", "--json-status-fd", "5", "--sync-fd", "6",
                "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/bin", "/bin",
                "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--perms", "0700", "--dir",
                "/run/user/1000", "--setenv", "XDG_RUNTIME_DIR", "/run/user/1000", "--file", "7", "/etc/passwd",
                "--ro-bind-data", "8", "/.flatpak-info", "--bind-data", "9", "/run/flatpak/bwrapinfo.json",
                "--seccomp", "10", "--chdir", "/", "--", "/app/bin/app"],
    "overlay": ["--overlay-src", "/usr", "--overlay-src", "/opt", "--ro-overlay", "/usr", "--tmp-overlay", "/opt",
                "--size", "1000000", "--tmpfs", "/tmp", "--chmod", "0755", "/tmp", "--", "sh"],
    "userns": ["--unshare-user", "--uid", "0", "--gid", "0", "--disable-userns", "--assert-userns-disabled",
               "--cap-add", "CAP_NET_ADMIN", "--cap-drop", "ALL", "--hostname", "x", "--unshare-uts", "--", "id"],
    "labels": ["--exec-label", "system_u:system_r:container_t:s0:c1,c2", "--file-label",
               "system_u:object_r:container_file_t:s0:c1,c2", "--", "true"],
    "tx": ["--tx-seccomp", "default", "--tx-landlock", "--ro-bind", "/", "/", "--", "true"],
    "errors": ["--perms", "0700", "--bind", "/a", "/b", "--", "true"],
}


def bwrap_seeds():
    for name, args in BWRAP_LINES.items():
        put("bwrap_args", name, b"\0".join(a.encode() for a in args))
    # After 0xff: what every descriptor read returns (`--args 3` here);
    # its first byte also plays SELinux (bits: enabled, label valid,
    # file label applied).
    data = b"\x07" + b"\0".join([b"--unshare-net", b"--setenv", b"A", b"b", b"--ro-bind", b"/", b"/"]) + b"\0"
    put("bwrap_args", "flatpak-args-data", b"\0".join([b"--args", b"3", b"--", b"true"]) + b"\xff" + data)


def portal_seeds():
    # The first byte: descriptors received (low bits), sandbox user host
    # root (0x10); then the worker's JSON, as src/bwrap/client.rs makes it.
    base = {"command": ["/bin/true"], "argv0": None, "env": [["PATH", "/usr/bin:/bin"]], "cwd": "/workspace",
            "chdir": None, "umask": 18,
            "ops": [{"op": "bind", "src": "/", "dst": "/", "mode": "ro", "optional": False},
                    {"op": "tmpfs", "dst": "/tmp", "mode": 0o755, "size": None},
                    {"op": "dev", "dst": "/dev"}, {"op": "proc", "dst": "/proc"}],
            "unshare": {"user": True, "pid": True, "ipc": False, "net": True, "uts": False, "cgroup": False},
            "uid": None, "gid": None, "hostname": None, "caps": None, "fds": [0, 1, 2]}
    variants = {
        "codex": {},
        "userns2": {"fds": [0, 1, 2, 3], "userns2Fd": 3},
        "host-only": {"hostOnly": ["--info-fd", "--pidns"]},
        "chmod-suid": {"ops": [{"op": "chmod", "dst": "/tmp/x", "mode": 0o4755}]},
        "perms": {"ops": [{"op": "data", "dst": "/f", "contents": [104, 105], "mode": 0o2644, "how": "file"},
                          {"op": "dir", "dst": "/d", "mode": 0o1777}]},
        "overlay": {"ops": [{"op": "overlay", "sources": ["/etc", "/usr"], "dst": "/o",
                             "kind": {"rw": {"upper": "/workspace/u", "work": "/workspace/w"}}},
                            {"op": "overlay", "sources": ["/etc"], "dst": "/t", "kind": "tmp"}]},
        "sizes": {"ops": [{"op": "tmpfs", "dst": "/a", "mode": 0o700, "size": 1048576},
                          {"op": "tmpfs", "dst": "/b", "mode": 0o700, "size": 0}]},
        "caps": {"unshare": {"user": False, "ipc": True, "net": False, "uts": True, "cgroup": False},
                 "caps": 4096, "hostname": "h", "uid": 0},
        "disable": {"disableUserns": True, "assertUsernsDisabled": True, "blockFd": 1, "lockFiles": ["/tmp/l"]},
        "dotdot": {"ops": [{"op": "symlink", "target": "/etc", "dst": "/../x"}]},
    }
    for name, change in variants.items():
        req = dict(base, **change)
        received = len(req["fds"])
        for root in (0, 0x10):
            put("portal_request", name + ("-root" if root else ""), bytes([received | root]) + js(req).encode())


EGRESS_HEADS = {
    "connect": b"CONNECT api.openai.com:443 HTTP/1.1\r\nHost: api.openai.com:443\r\nUser-Agent: curl/7.88.1\r\n\r\n",
    "connect-v6": b"CONNECT [2001:db8::1]:8443 HTTP/1.1\r\n\r\n\x16\x03\x01",
    "forward": b"GET http://plain.model.test:8080/a?b=1 HTTP/1.1\r\nHost: evil\r\nProxy-Authorization: x\r\n"
               b"Connection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\nbody",
    "forward-10": b"POST http://a.test HTTP/1.0\r\nContent-Length: 4\r\n\r\nbody",
    "numeric": b"CONNECT 0x7f.1:80 HTTP/1.1\r\n\r\n",
}


def egress_seeds():
    # The first byte picks the parser: 0 HTTP, 1 SOCKS5, 2 allowlist lines.
    for name, head in EGRESS_HEADS.items():
        put("egress_request", "http-" + name, b"\0" + head)
    name = b"api.model.test"
    put("egress_request", "socks-name", b"\1\5\2\0\2\5\1\0\3" + bytes([len(name)]) + name + b"\x01\xbb")
    put("egress_request", "socks-v4", b"\1\5\1\0\5\1\0\1\x7f\0\0\1\0\x50")
    put("egress_request", "socks-v6", b"\1\5\1\0\5\1\0\4" + bytes(15) + b"\1\0\x50")
    put("egress_request", "allowlist", b"\2api.openai.com\n*.example.com:*\n[2001:db8::1]:443\n203.0.113.7:80\n"
        b"10.0.0.0/8\nfd00::/8\nexample.com:8080\n*.openai.com\napi.openai.com\n")


if __name__ == "__main__":
    # Files are overwritten, never removed: seeds/<target>/crash-* are the
    # inputs of crashes found and fixed, kept as regression seeds.
    manifest_seeds()
    zip_seeds()
    proxy_seeds()
    acp_seeds()
    seccomp_seeds()
    skills_seeds()
    launcher_seeds()
    bwrap_seeds()
    portal_seeds()
    egress_seeds()
    for t in sorted(os.listdir(SEEDS)):
        print(t, len(os.listdir(os.path.join(SEEDS, t))))
