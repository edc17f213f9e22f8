#!/usr/bin/env python3
"""Echo model: a stdlib-only model server speaking inferd's "http" protocol.

GET /healthz answers 200 once the server listens; POST / echoes its JSON inputs.
Special inputs and boot-time environment variables let tests and manifests show
every failure mode; see README.md.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 keeps connections alive between calls; every reply sets Content-Length.
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; without TCP_NODELAY, Nagle's algorithm
    # and delayed ACKs add 40 ms to every reply.
    disable_nagle_algorithm = True

    def log_message(self, format, *args):
        pass  # one line per request would drown the model's own log

    def reply(self, status, body, content_type="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path != "/healthz":
            self.reply(404, {"error": "not found"})
        elif os.environ.get("NEVER_READY") == "1":
            self.reply(503, {"ok": False})
        else:
            self.reply(200, {"ok": True})
            exit_after_ready()

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        try:
            inputs = json.loads(self.rfile.read(length))
        except ValueError as e:
            self.reply(400, {"error": f"inputs are not JSON: {e}"})
            return
        if not isinstance(inputs, dict):
            self.reply(400, {"error": "inputs must be a JSON object"})
            return

        if "runLog" in inputs:
            log_run(str(inputs["runLog"]), inputs)
        if inputs.get("crash"):
            print("crashing on request", flush=True)
            os._exit(3)
        if "crashOnce" in inputs:
            # Crash the first time only: the flag file says it happened, so a
            # retried call succeeds.
            flag = str(inputs["crashOnce"])
            try:
                os.close(os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            except FileExistsError:
                pass
            else:
                print("crashing once on request", flush=True)
                os._exit(3)
        if "holdOnce" in inputs:
            hold_once(str(inputs["holdOnce"]))
        if "until" in inputs:
            # Held until the test says so: a call that runs exactly as long
            # as the test needs, however fast or busy the machine.
            while not os.path.exists(str(inputs["until"])):
                time.sleep(0.02)
        if inputs.get("hang"):
            threading.Event().wait()
        if "sleep" in inputs:
            time.sleep(float(inputs["sleep"]))
        if "burn" in inputs:
            burn(float(inputs["burn"]))
        if "holdMiB" in inputs:
            held = b"\x01" * (int(inputs["holdMiB"]) << 20)  # filled: every page touched
            del held
        if "fail" in inputs:
            self.reply(500, {"error": str(inputs["fail"])})
            return
        if "raw" in inputs:
            self.reply(200, str(inputs["raw"]).encode(), "text/plain")
            return
        if "latin1" in inputs:
            text = json.dumps({"text": str(inputs["latin1"])}, ensure_ascii=False)
            self.reply(200, text.encode("latin-1", "replace"))
            return

        out = {
            "echo": inputs,
            "greeting": os.environ.get("GREETING"),
            "replica": os.environ.get("INFERD_REPLICA_ID"),
            "pid": os.getpid(),
        }
        if "bytes" in inputs:
            out["data"] = "x" * int(inputs["bytes"])
        if "env" in inputs:
            out["env"] = os.environ.get(str(inputs["env"]))
        if inputs.get("whoami"):
            out["uid"], out["gid"] = os.getuid(), os.getgid()
            out["environ"] = sorted(os.environ)
        if "read" in inputs:
            try:
                with open(str(inputs["read"]), "rb") as f:
                    out["read"] = "read %d bytes" % len(f.read(16))
            except OSError as e:
                out["read"] = "error: " + e.strerror
        if inputs.get("spawn"):
            out["child"] = subprocess.Popen(["sleep", "1000"]).pid
        self.reply(200, out)


def burn(seconds):
    """Spin on the CPU until this thread has used that many seconds of CPU
    time: a call whose CPU use the usage ledger can check."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def log_run(path, inputs):
    """Append one JSON line for this run to path before the call does anything
    else, so a run that never answers (its node was killed) is counted too:
    tests count how often each call ran. The line holds the inputs, the
    replica, the time it began (Unix seconds) and, with {"env": NAME}, that
    variable's value."""
    line = {"inputs": inputs, "replica": os.environ.get("INFERD_REPLICA_ID"), "pid": os.getpid(), "t": time.time()}
    if "env" in inputs:
        line["env"] = os.environ.get(str(inputs["env"]))
    # One write of one line with O_APPEND: lines from replicas on several
    # nodes appending at once never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def hold_once(path):
    """The first run to get here (it creates path + ".held") waits until the
    file path exists, then creates path + ".answered" and goes on; every
    later run goes on at once. A test holds a call's
    first run on one node while a re-run elsewhere finishes, then lets the
    first one answer late."""
    try:
        os.close(os.open(path + ".held", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return
    while not os.path.exists(path):
        time.sleep(0.05)
    # Say the held run is answering now.
    os.close(os.open(path + ".answered", os.O_CREAT | os.O_WRONLY, 0o600))


_exit_timer = None


def exit_after_ready():
    """With EXIT_AFTER_READY=<seconds>, exit with status 4 that long after the
    first successful health check: a model that dies right after it is ready."""
    global _exit_timer
    delay = os.environ.get("EXIT_AFTER_READY")
    if delay is None or _exit_timer is not None:
        return

    def die():
        print("exiting after ready: EXIT_AFTER_READY is set", flush=True)
        os._exit(4)

    _exit_timer = threading.Timer(float(delay), die)
    _exit_timer.daemon = True
    _exit_timer.start()


def main():
    # SystemExit raised from the handler unwinds serve_forever (or the boot sleep);
    # request threads are daemon threads, so nothing waits for them.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))

    time.sleep(float(os.environ.get("BOOT_DELAY") or 0))
    if os.environ.get("BOOT_FAIL") == "1":
        print("boot failed: BOOT_FAIL is set", file=sys.stderr, flush=True)
        sys.exit(1)

    # LISTEN_PORT: a model that ignores $PORT, as one with a fixed port does.
    port = int(os.environ.get("LISTEN_PORT") or os.environ["PORT"])
    with ThreadingHTTPServer(("127.0.0.1", port), Handler) as server:
        print(f"echo model listening on 127.0.0.1:{port}", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()
