#!/usr/bin/env python3
"""The egress proxy of `--network allow`, measured (scripts/bench egress
builds the release binaries and calls this).

    scripts/bench.d/egress.py BIN_DIR [--runs N] [--requests N] [--connections N]

1. Throughput: a 100 MB download (curl, to /dev/null) from a loopback
   server, directly from the host and from inside a sandbox through the
   proxy, alternating, RUNS times each; medians and their ratio. With
   `SRT=path/to/srt` (npm @anthropic-ai/sandbox-runtime), the anchor in
   the same rounds: the same download inside `srt`, through its HTTP
   proxy (Node, bridged into its sandbox by socat).
2. Added latency per request: REQUESTS sequential requests for a small
   file, each on a new connection (the proxy's whole per-connection path:
   accept, parse, allowlist, resolve, guard, connect), by one Python client,
   directly and through the proxy (plain HTTP by absolute URI, and a
   CONNECT tunnel); p50 and p99 of each and the differences.
3. Memory per open connection: the proxy process's RssAnon with no
   connection and with CONNECTIONS idle tunnels open.

The server is 127.0.0.1; the sandbox reaches it as `localhost` through the
proxy, with `--allow-range 127.0.0.0/8` (release builds resolve names with
the system's resolver only).
"""
import argparse
import http.server
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

SIZE = 100 * 1024 * 1024

p = argparse.ArgumentParser()
p.add_argument("bin_dir")
p.add_argument("--runs", type=int, default=5)
p.add_argument("--requests", type=int, default=500)
p.add_argument("--connections", type=int, default=60)
args = p.parse_args()
launcher = os.path.join(args.bin_dir, "tuixiu-sandbox")
work = tempfile.mkdtemp(prefix="tuixiu-bench-egress-")
os.chmod(work, 0o755)
big = os.path.join(work, "big")
with open(big, "wb") as f:
    f.write(os.urandom(1 << 20) * (SIZE >> 20))
with open(os.path.join(work, "small"), "wb") as f:
    f.write(b"x" * 512)


class Files(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        path = os.path.join(work, self.path.lstrip("/").split("?")[0])
        size = os.path.getsize(path)
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()
        with open(path, "rb") as f:
            self.connection.sendfile(f)
        self.close_connection = True


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Files)
server.daemon_threads = True
port = server.server_address[1]
threading.Thread(target=server.serve_forever, daemon=True).start()

CLIENT = r'''
import socket, sys, time, json
mode, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
times = []
for i in range(n):
    t0 = time.perf_counter()
    if mode == "direct":
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
    elif mode == "forward":
        s = socket.create_connection(("127.0.0.1", 3128))
        s.sendall(b"GET http://%s:%d/small HTTP/1.1\r\nHost: x\r\n\r\n" % (host.encode(), port))
    else:
        s = socket.create_connection(("127.0.0.1", 3128))
        s.sendall(b"CONNECT %s:%d HTTP/1.1\r\n\r\n" % (host.encode(), port))
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += s.recv(1)
        assert head.startswith(b"HTTP/1.1 200"), head
        s.sendall(b"GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
    got = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"x" * 512), got[:200]
    s.close()
    times.append(time.perf_counter() - t0)
print(json.dumps(times))
'''
HOLD = r'''
import socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
held = []
for i in range(n):
    s = socket.create_connection(("127.0.0.1", 3128))
    s.sendall(b"CONNECT localhost:%d HTTP/1.1\r\n\r\n" % port)
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += s.recv(1)
    assert head.startswith(b"HTTP/1.1 200"), head
    held.append(s)
print("ready", flush=True)
sys.stdin.read()
'''
with open(os.path.join(work, "client.py"), "w") as f:
    f.write(CLIENT)
with open(os.path.join(work, "hold.py"), "w") as f:
    f.write(HOLD)

sandbox = [launcher, "run", "--workspace", work, "--ro-bind", work, "/bench", "--network", "allow",
           "--allow-host", "localhost:%d" % port, "--allow-range", "127.0.0.0/8", "--allow-range", "::1/128", "--"]


def curl_speed(inside):
    cmd = ["curl", "-sS", "-o", "/dev/null", "-w", "%{speed_download} %{size_download}"]
    if inside:
        cmd = sandbox + cmd + ["--noproxy", "", "-x", "http://127.0.0.1:3128", "http://localhost:%d/big" % port]
    else:
        cmd = cmd + ["http://127.0.0.1:%d/big" % port]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()
    assert int(out[1]) == SIZE, out
    return float(out[0])


SRT = os.environ.get("SRT")
if SRT:
    with open(os.path.join(work, "srt.json"), "w") as f:
        json.dump({"network": {"allowedDomains": ["localhost"], "deniedDomains": []},
                   "filesystem": {"denyRead": [], "allowWrite": [], "denyWrite": []}}, f)


def srt_speed():
    """The anchor: curl inside srt, through srt's proxy (its variables name it)."""
    script = ('curl -sS -o /dev/null -w "%%{speed_download} %%{size_download}" --noproxy "" '
              '-x "$HTTP_PROXY" http://localhost:%d/big' % port)
    out = subprocess.run([SRT, "--settings", os.path.join(work, "srt.json"), "-c", script],
                         capture_output=True, text=True, check=True).stdout.split()
    assert int(out[1]) == SIZE, out
    return float(out[0])


def load():
    return open("/proc/loadavg").read().split()[:3]


print("load average before: %s" % " ".join(load()))
direct, proxied, anchor = [], [], []
curl_speed(False), curl_speed(True)  # warm the page cache and the binaries
for i in range(args.runs):
    direct.append(curl_speed(False))
    proxied.append(curl_speed(True))
    if SRT:
        anchor.append(srt_speed())
d, pr = statistics.median(direct), statistics.median(proxied)
print("throughput, 100 MB over loopback (curl, median of %d):" % args.runs)
print("  direct       %8.0f MB/s   %s" % (d / 1e6, " ".join("%.0f" % (x / 1e6) for x in direct)))
print("  through proxy %7.0f MB/s   %s" % (pr / 1e6, " ".join("%.0f" % (x / 1e6) for x in proxied)))
print("  ratio        %8.2f x" % (pr / d))
if SRT:
    a = statistics.median(anchor)
    print("  srt's proxy  %8.0f MB/s   %s" % (a / 1e6, " ".join("%.0f" % (x / 1e6) for x in anchor)))
    print("  srt ratio    %8.2f x   (ours / srt's: %.1f x)" % (a / d, pr / a))


def lat(mode):
    cmd = ["python3", os.path.join(work, "client.py"), mode, "localhost", str(port), str(args.requests)]
    if mode != "direct":
        cmd = sandbox + ["python3", "/bench/client.py", mode, "localhost", str(port), str(args.requests)]
    times = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    times.sort()
    return times[len(times) // 2] * 1e3, times[int(len(times) * 0.99) - 1] * 1e3


print("latency per request, new connection each, %d sequential (ms):" % args.requests)
base = lat("direct")
print("  direct         p50 %.3f  p99 %.3f" % base)
for mode in ("forward", "connect"):
    m = lat(mode)
    print("  %-14s p50 %.3f  p99 %.3f   added: p50 %+.3f  p99 %+.3f" % (mode, m[0], m[1], m[0] - base[0], m[1] - base[1]))


def proxy_pid(launcher_pid):
    """The launcher's child that is not the sandbox: in the launcher's own net namespace."""
    mine = os.readlink("/proc/%d/ns/net" % launcher_pid)
    for task in os.listdir("/proc/%d/task" % launcher_pid):
        for child in open("/proc/%d/task/%s/children" % (launcher_pid, task)).read().split():
            if os.readlink("/proc/%s/ns/net" % child) == mine:
                return int(child)
    raise SystemExit("no proxy process found")


def rss_anon(pid):
    for line in open("/proc/%d/status" % pid):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])


def held(n):
    proc = subprocess.Popen(sandbox + ["python3", "/bench/hold.py", str(port), str(n)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    kb = rss_anon(proxy_pid(proc.pid))
    proc.stdin.close()
    proc.wait()
    return kb


idle = held(0)
full = held(args.connections)
print("memory: proxy RssAnon %d KiB idle, %d KiB with %d open tunnels: %.1f KiB per connection"
      % (idle, full, args.connections, (full - idle) / args.connections))
print("load average after: %s" % " ".join(load()))
server.shutdown()
subprocess.run(["rm", "-rf", work])
