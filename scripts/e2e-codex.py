#!/usr/bin/env python3
"""End to end with the real codex-acp (not in CI; see scripts/e2e-codex.sh).

Starts a loopback stand-in of the OpenAI Responses API, then drives
`tuixiu-sandbox run --manifest m.json ... -- codex-acp` over ACP (stdio
JSON-RPC): initialize, authenticate, session/new, one prompt. The stand-in
model asks codex for a shell command, then an apply_patch, then answers;
codex runs both in its default mode (workspace-write, approvals on
request), i.e. through its own bwrap, which our sandbox serves. Prints a
report and exits 0 when both tool calls succeeded and codex's own
restrictions held.

    e2e-codex.py WORKDIR -- COMMAND...   (COMMAND starts codex-acp in the sandbox)
"""
import http.server
import json
import os
import subprocess
import sys
import threading
import time

WORKDIR = sys.argv[1]
COMMAND = sys.argv[sys.argv.index("--") + 1:]
PORT = int(os.environ.get("FAKE_OPENAI_PORT", "18765"))
SHELL_CMD = ("echo hello-from-codex > hello.txt && cat hello.txt && "
             "(echo x >> .git/config 2>/dev/null && echo GIT_WRITABLE || echo GIT_PROTECTED) && "
             "(unshare -U true 2>/dev/null && echo UNSHARE_WORKS || echo UNSHARE_DENIED) && "
             "(test -S /run/tuixiu/nested.sock && echo PORTAL_VISIBLE || echo IN_NESTED_SANDBOX)")
PATCH = "*** Begin Patch\n*** Add File: patched.txt\n+patched by codex\n*** End Patch\n"
log = open(os.path.join(WORKDIR, "responses.log"), "w")


def tool_names(body):
    return {t.get("name"): t for t in body.get("tools", []) if isinstance(t, dict)}


def outputs(body):
    return [i for i in body.get("input", []) if isinstance(i, dict)
            and i.get("type") in ("function_call_output", "custom_tool_call_output")]


class Model(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        log.write(json.dumps({"path": self.path, "tools": sorted(k for k in tool_names(body) if k),
                              "outputs": outputs(body)}) + "\n")
        log.flush()
        tools = tool_names(body)
        done = outputs(body)
        if len(done) == 0:
            if "shell" in tools:
                item = {"type": "function_call", "name": "shell", "call_id": "call_shell",
                        "arguments": json.dumps({"command": ["bash", "-lc", SHELL_CMD]})}
            elif "shell_command" in tools:
                item = {"type": "function_call", "name": "shell_command", "call_id": "call_shell",
                        "arguments": json.dumps({"command": SHELL_CMD})}
            else:
                item = {"type": "function_call", "name": "exec_command", "call_id": "call_shell",
                        "arguments": json.dumps({"cmd": SHELL_CMD})}
        elif len(done) == 1:
            tool = tools.get("apply_patch", {})
            if tool.get("type") == "custom":
                item = {"type": "custom_tool_call", "name": "apply_patch", "call_id": "call_patch", "input": PATCH}
            else:
                item = {"type": "function_call", "name": "apply_patch", "call_id": "call_patch",
                        "arguments": json.dumps({"input": PATCH})}
        else:
            item = {"type": "message", "role": "assistant", "id": "msg_1",
                    "content": [{"type": "output_text", "text": "all done"}]}
        events = [
            ("response.created", {"type": "response.created", "response": {"id": "resp_%d" % len(done)}}),
            ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}),
            ("response.completed", {"type": "response.completed", "response": {
                "id": "resp_%d" % len(done),
                "usage": {"input_tokens": 10, "input_tokens_details": None, "output_tokens": 5,
                          "output_tokens_details": None, "total_tokens": 15}}}),
        ]
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        for name, data in events:
            self.wfile.write(("event: %s\ndata: %s\n\n" % (name, json.dumps(data))).encode())
        self.wfile.flush()


server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Model)
threading.Thread(target=server.serve_forever, daemon=True).start()

agent = subprocess.Popen(COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=open(os.path.join(WORKDIR, "agent.stderr"), "w"))
next_id = [0]
updates = []


def send(msg):
    agent.stdin.write((json.dumps(msg) + "\n").encode())
    agent.stdin.flush()


def call(method, params, timeout=180):
    next_id[0] += 1
    rid = next_id[0]
    send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = agent.stdout.readline()
        if not line:
            sys.exit("codex-acp exited (see %s/agent.stderr)" % WORKDIR)
        msg = json.loads(line)
        if msg.get("id") == rid and "method" not in msg:
            return msg
        if msg.get("method") == "session/update":
            updates.append(msg["params"]["update"])
        elif msg.get("method") == "session/request_permission":
            options = msg["params"]["options"]
            allow = next((o for o in options if o["kind"].startswith("allow")), options[0])
            updates.append({"permission": msg["params"].get("toolCall", {}).get("title"), "chose": allow["optionId"]})
            send({"jsonrpc": "2.0", "id": msg["id"],
                  "result": {"outcome": {"outcome": "selected", "optionId": allow["optionId"]}}})
        elif "method" in msg and "id" in msg:
            send({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": "not offered"}})
    sys.exit("no answer to %s" % method)


init = call("initialize", {"protocolVersion": 1, "clientCapabilities": {
    "fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False}})
print("initialize:", "ok" if "result" in init else init)
methods = [m["id"] for m in init.get("result", {}).get("authMethods", [])]
key_method = next((m for m in methods if "api" in m), None)
if key_method:
    auth = call("authenticate", {"methodId": key_method})
    print("authenticate:", key_method, "ok" if "result" in auth else auth.get("error"))
new = call("session/new", {"cwd": "/workspace", "mcpServers": []})
if "result" not in new:
    sys.exit("session/new failed: %s" % new)
session = new["result"]["sessionId"]
print("session/new: ok")
result = call("session/prompt", {"sessionId": session, "prompt": [
    {"type": "text", "text": "Run the command, then apply the patch."}]}, timeout=300)
print("session/prompt:", result.get("result") or result.get("error"))
agent.stdin.close()
try:
    agent.wait(timeout=20)
except subprocess.TimeoutExpired:
    agent.kill()

calls = {}
for u in updates:
    if u.get("sessionUpdate") in ("tool_call", "tool_call_update"):
        c = calls.setdefault(u["toolCallId"], {})
        c.update({k: v for k, v in u.items() if k in ("title", "status", "kind", "rawOutput", "content")})
for cid, c in calls.items():
    print("tool call %s: %s -> %s" % (cid, c.get("title"), c.get("status")))
    if c.get("rawOutput"):
        print("   output:", json.dumps(c["rawOutput"])[:600])
for u in updates:
    if "permission" in u:
        print("permission asked:", u)
ws = os.path.join(WORKDIR, "workspace")
hello = open(os.path.join(ws, "hello.txt")).read() if os.path.exists(os.path.join(ws, "hello.txt")) else None
patched = open(os.path.join(ws, "patched.txt")).read() if os.path.exists(os.path.join(ws, "patched.txt")) else None
print("workspace hello.txt:", repr(hello))
print("workspace patched.txt:", repr(patched))
shell_out = json.dumps(calls)
ok = (hello == "hello-from-codex\n" and patched == "patched by codex\n"
      and "GIT_PROTECTED" in shell_out and "UNSHARE_DENIED" in shell_out and "IN_NESTED_SANDBOX" in shell_out
      and all(c.get("status") == "completed" for c in calls.values()) and len(calls) >= 2)
print("RESULT:", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
