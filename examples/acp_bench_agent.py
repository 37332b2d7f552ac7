#!/usr/bin/env python3
"""The ACP agent of the daemon benchmark (examples/daemon_bench/).

Stdlib only, one thread, started with `python3 -S` so that its own start
is as short as Python allows: `initialize` is answered before `json` is
even imported. A prompt's text is one command:

  reads N PATH      N sequential fs/read_text_file of PATH, then R rounds of
                    8 sequential and 8 concurrent reads; each timed here, from
                    writing the request to reading its response (what the
                    agent sees); reported as one agent_message_chunk (JSON)
  flood N           N session/update notifications of 200 bytes each
                    (sequence numbers in order), written as fast as the pipe
                    takes them, then the end of the turn
"""

import os
import sys

out = sys.stdout.buffer
inp = sys.stdin.buffer


def write(data):
    out.write(data)
    out.flush()


def first_initialize():
    # The daemon's first message is `initialize` with id 1; answer it
    # without parsing JSON (importing json is most of Python's start).
    line = inp.readline()
    if b'"initialize"' not in line:
        return line
    write(b'{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1,"agentCapabilities":'
          b'{"loadSession":false,"promptCapabilities":{}},"authMethods":[]}}\n')
    return None


def main():
    pending = first_initialize()
    import json
    import time

    next_id = [1000]

    def send(msg):
        write(json.dumps(msg, separators=(",", ":")).encode() + b"\n")

    def request(method, params):
        next_id[0] += 1
        send({"jsonrpc": "2.0", "id": next_id[0], "method": method, "params": params})
        return next_id[0]

    def await_ids(ids):
        want = set(ids)
        got = {}
        while want:
            msg = json.loads(inp.readline())
            if msg.get("id") in want and "method" not in msg:
                want.discard(msg["id"])
                got[msg["id"]] = msg
        return got

    def timed_read(sid, path):
        t = time.perf_counter_ns()
        rid = request("fs/read_text_file", {"sessionId": sid, "path": path})
        msg = await_ids([rid])[rid]
        dt = time.perf_counter_ns() - t
        if "error" in msg:
            raise SystemExit("read failed: %r" % msg["error"])
        return dt, len(msg["result"]["content"])

    def reads(sid, n, path, rounds=50):
        single = []
        size = 0
        for _ in range(n):
            dt, size = timed_read(sid, path)
            single.append(dt)
        seq8, conc8 = [], []
        for _ in range(rounds):
            t = time.perf_counter_ns()
            for _ in range(8):
                timed_read(sid, path)
            seq8.append(time.perf_counter_ns() - t)
            t = time.perf_counter_ns()
            ids = [request("fs/read_text_file", {"sessionId": sid, "path": path}) for _ in range(8)]
            got = await_ids(ids)
            conc8.append(time.perf_counter_ns() - t)
            if any("error" in m for m in got.values()):
                raise SystemExit("concurrent read failed")
        return {"size": size, "single_ns": single, "seq8_ns": seq8, "conc8_ns": conc8}

    def flood(sid, n):
        head = ('{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"%s",'
                '"update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"' % sid)
        tail = '"}}}}\n'
        chunk = []
        for i in range(n):
            text = "m%d:" % i
            text += "x" * (200 - len(head) - len(tail) - len(text))
            chunk.append(head + text + tail)
            if len(chunk) == 4096:
                write("".join(chunk).encode())
                chunk = []
        if chunk:
            write("".join(chunk).encode())

    def chunk(sid, text):
        send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": {
            "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}}})

    def handle(msg):
        method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": 1, "agentCapabilities": {}}})
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": "s1"}})
        elif method == "session/prompt":
            sid = params.get("sessionId")
            text = "".join(b.get("text", "") for b in params.get("prompt", []) if b.get("type") == "text")
            cmd, _, arg = text.strip().partition(" ")
            if cmd == "reads":
                n, _, path = arg.partition(" ")
                chunk(sid, json.dumps(reads(sid, int(n), path)))
            elif cmd == "flood":
                flood(sid, int(arg))
            send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})
        elif rid is not None and method is not None:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "method not found"}})

    if pending:
        handle(json.loads(pending))
    for line in inp:
        if line.strip():
            handle(json.loads(line))


if __name__ == "__main__":
    try:
        main()
    except (BrokenPipeError, KeyboardInterrupt):
        os._exit(0)
