#!/usr/bin/env python3
"""Batch model: a stdlib-only model server that answers inferd's batches.

It stands in for a GPU model whose forward pass costs a fixed part plus a
small part per input: BATCH_FIXED_MS (default 20) plus BATCH_ITEM_MS
(default 1) per call, one pass at a time, as one GPU runs one pass at a
time. POST /batch takes inferd's batch, {"batch": [inputs, ...]}, and
answers {"outputs": [...]} in one pass; POST / takes one call's inputs and
answers them in a pass of its own. See README.md for the inputs that show
each failure of the batch protocol.
"""

import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FIXED = float(os.environ.get("BATCH_FIXED_MS") or 20) / 1000
PER_ITEM = float(os.environ.get("BATCH_ITEM_MS") or 1) / 1000

device = threading.Lock()  # one forward pass at a time
passes = 0                 # forward passes so far


class WholeBatchError(Exception):
    """An input that fails the whole request, not just its own call."""


def forward(batch):
    """Runs one pass over the batch and returns one output per input: the
    input echoed with the pass it ran in, or {"error": "..."} for an input
    that fails alone."""
    global passes
    for inputs in batch:
        if isinstance(inputs, dict) and "hold" in inputs:
            # Wait, before the pass, until the file exists: a test holds a
            # batch while it queues the next calls.
            while not os.path.exists(str(inputs["hold"])):
                time.sleep(0.01)
    with device:
        passes += 1
        time.sleep(FIXED + PER_ITEM * len(batch))
        outputs = []
        for i, inputs in enumerate(batch):
            if not isinstance(inputs, dict):
                outputs.append({"error": "inputs must be a JSON object"})
                continue
            if inputs.get("crash"):
                print("crashing on request", flush=True)
                os._exit(3)
            if "reject" in inputs:
                raise WholeBatchError(str(inputs["reject"]))
            if "fail" in inputs:
                outputs.append({"error": str(inputs["fail"])})
                continue
            outputs.append({"echo": inputs, "batchSize": len(batch), "index": i, "pass": passes,
                            "replica": os.environ.get("INFERD_REPLICA_ID")})
        if any(isinstance(x, dict) and x.get("dropOne") for x in batch):
            outputs.pop()  # a model that loses an output: inferd fails the batch
        return outputs


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # see examples/echo/server.py

    def log_message(self, format, *args):
        pass

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/healthz":
            self.reply(200, {"ok": True})
        else:
            self.reply(404, {"error": "not found"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length))
        except ValueError as e:
            self.reply(400, {"error": f"not JSON: {e}"})
            return
        try:
            if self.path == "/batch":
                batch = body.get("batch") if isinstance(body, dict) else None
                if not isinstance(batch, list):
                    self.reply(400, {"error": 'want {"batch": [inputs, ...]}'})
                    return
                self.reply(200, {"outputs": forward(batch)})
            elif self.path == "/":
                out = forward([body])
                if out and isinstance(out[0], dict) and set(out[0]) == {"error"}:
                    self.reply(400, out[0])
                else:
                    self.reply(200, out[0] if out else {})
            else:
                self.reply(404, {"error": "not found"})
        except WholeBatchError as e:
            self.reply(500, {"error": str(e)})


def main():
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    port = int(os.environ["PORT"])
    with ThreadingHTTPServer(("127.0.0.1", port), Handler) as server:
        print(f"batch model listening on 127.0.0.1:{port} "
              f"({FIXED * 1000:g} ms + {PER_ITEM * 1000:g} ms per call)", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()
