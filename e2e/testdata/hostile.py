#!/usr/bin/env python3
"""A hostile model for the containment tests (e2e/containment_test.go).

It speaks inferd's "http" protocol (stdlib only) and, asked in its inputs, tries
what docs/security.md says a model may or may not do to another team's model,
to inferd and to the box. Each attempt reports what happened, never raises:

  {"readEnviron": PID}        read /proc/PID/environ      -> {"environ": text | "error: ..."}
  {"signal": PID}             kill(PID, SIGKILL)          -> {"signal": "sent" | "error: ..."}
  {"fetch": URL}              GET URL (2 s)               -> {"fetch": body | "error: ..."}
  {"etcdRange": URL}          read every key of the etcd at URL through its JSON gateway (POST
                              /v3/kv/range; https without checking the server and with no client
                              certificate) -> {"etcd": body | "error: ..."}
  {"escape": true}            a child in its own session  -> {"escaped": PID}
  {"allocate": MIB}           hold MIB MiB of memory      -> {"allocated": MIB}
  {"readFile": PATH}          read PATH                   -> {"file": text | "error: ..."}
  {"shm": {"name": N, "mib": M}}  write M MiB to /dev/shm/N -> {"shm": "ok" | "error: ..."}
  {"listProc": true}          every cmdline in /proc      -> {"procs": ["pid: cmdline", ...]}
  {"userns": true}            unshare(CLONE_NEWUSER), in a child -> {"userns": "ok" | "error: ..."}
  {"mkdir": PATH}             make a directory            -> {"mkdir": "ok" | "error: ..."}
  {"redirect": URL}           answer 307 to URL
  {"hugeHeader": MIB}         answer with a MIB MiB header

GET /id answers its INFERD_REPLICA_ID, so a fetch says whose server it reached.
With BOOT_LOG_BYTES=N it writes N bytes of log lines at boot and exits 1: a
crash loop that floods its log.
"""

import ctypes
import json
import os
import signal
import ssl
import subprocess
import sys
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

held = []  # memory asked for with "allocate", kept while the process lives


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format, *args):
        pass

    def reply(self, status, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/healthz":
            self.reply(200, {"ok": True})
        elif self.path == "/id":
            self.reply(200, {"replica": os.environ.get("INFERD_REPLICA_ID")})
        else:
            self.reply(404, {"error": "not found"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        inputs = json.loads(self.rfile.read(length) or b"{}")
        if "redirect" in inputs:
            self.reply(307, {"moved": True}, [("Location", inputs["redirect"])])
            return
        if "hugeHeader" in inputs:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.wfile.write(b"X-Huge: ")
            chunk = b"h" * (1 << 20)
            try:
                for _ in range(int(inputs["hugeHeader"])):
                    self.wfile.write(chunk)
                self.wfile.write(b"\r\nContent-Length: 2\r\n\r\n{}")
            except OSError:
                pass  # inferd hung up: what it should do
            return
        out = {
            "replica": os.environ.get("INFERD_REPLICA_ID"),
            "pid": os.getpid(),
            "uid": os.getuid(),
            "port": int(os.environ["PORT"]),
        }
        if "readEnviron" in inputs:
            try:
                with open("/proc/%d/environ" % int(inputs["readEnviron"]), "rb") as f:
                    out["environ"] = f.read(8192).replace(b"\0", b"\n").decode(errors="replace")
            except OSError as e:
                out["environ"] = "error: " + e.strerror
        if "signal" in inputs:
            try:
                os.kill(int(inputs["signal"]), signal.SIGKILL)
                out["signal"] = "sent"
            except OSError as e:
                out["signal"] = "error: " + e.strerror
        if "fetch" in inputs:
            try:
                with urllib.request.urlopen(inputs["fetch"], timeout=2) as r:
                    out["fetch"] = r.read(4096).decode(errors="replace")
            except Exception as e:  # refused, unreachable, timed out: all the same here
                out["fetch"] = "error: %s" % e
        if "etcdRange" in inputs:
            try:
                req = urllib.request.Request(inputs["etcdRange"] + "/v3/kv/range",
                                             data=b'{"key":"AA==","range_end":"AA=="}',
                                             headers={"Content-Type": "application/json"})
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
                with urllib.request.urlopen(req, timeout=2, context=ctx) as r:
                    out["etcd"] = r.read(65536).decode(errors="replace")
            except Exception as e:  # refused, a TLS handshake failing, an HTTP error: all the same here
                out["etcd"] = "error: %s" % e
        if inputs.get("escape"):
            out["escaped"] = subprocess.Popen(["sleep", "1000"], start_new_session=True).pid
        if "readFile" in inputs:
            try:
                with open(inputs["readFile"], "rb") as f:
                    out["file"] = f.read(8192).decode(errors="replace")
            except OSError as e:
                out["file"] = "error: " + e.strerror
        if "shm" in inputs:
            try:
                with open("/dev/shm/" + inputs["shm"]["name"], "wb") as f:
                    for _ in range(int(inputs["shm"]["mib"])):
                        f.write(b"s" * (1 << 20))
                out["shm"] = "ok"
            except OSError as e:
                out["shm"] = "error: " + e.strerror
        if inputs.get("listProc"):
            out["procs"] = []
            for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
                try:
                    with open("/proc/%s/cmdline" % pid, "rb") as f:
                        out["procs"].append(pid + ": " + f.read(4096).replace(b"\0", b" ").decode(errors="replace"))
                except OSError:
                    pass
        if inputs.get("userns"):
            out["userns"] = user_namespace()
        if "mkdir" in inputs:
            try:
                os.mkdir(inputs["mkdir"])
                out["mkdir"] = "ok"
            except OSError as e:
                out["mkdir"] = "error: " + e.strerror
        if "allocate" in inputs:
            held.append(bytearray(int(inputs["allocate"]) << 20))  # zero-filled: every page touched
            out["allocated"] = int(inputs["allocate"])
        self.reply(200, out)


def user_namespace():
    """unshare(CLONE_NEWUSER) in a child: a threaded process may not."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        res = libc.unshare(0x10000000)
        os.write(w, (("error: " + os.strerror(ctypes.get_errno())) if res != 0 else "ok").encode())
        os._exit(0)
    os.close(w)
    answer = os.read(r, 200).decode()
    os.close(r)
    os.waitpid(pid, 0)
    return answer


def main():
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    flood = int(os.environ.get("BOOT_LOG_BYTES") or 0)
    if flood:
        line = ("flood from %s " % os.environ.get("INFERD_REPLICA_ID")).ljust(99, "x") + "\n"
        for _ in range(flood // len(line) + 1):
            sys.stdout.write(line)
        sys.stdout.flush()
        sys.exit(1)
    port = int(os.environ["PORT"])
    with ThreadingHTTPServer(("127.0.0.1", port), Handler) as server:
        print("hostile model listening on 127.0.0.1:%d" % port, flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()
