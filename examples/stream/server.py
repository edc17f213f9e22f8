#!/usr/bin/env python3
"""Streaming model: a stdlib-only model server that streams its reply.

It speaks inferd's "http" protocol and answers POST / with
Content-Type: application/x-ndjson, one JSON object per line, written as each
is ready: {"token": WORD, "index": N} for every word of "prompt", then
{"done": true, "tokens": N}. inferd passes each line on to the call's event
stream (GET /v1/calls/CALLID/events) as it arrives, and the finished call's
modelOutputs is the list of lines.

Inputs:
  prompt   text whose words are streamed back (default "hello from a stream")
  delay    seconds to wait between lines (default 0.2)
  waitFor  a file path: after the first line, wait until that file exists
           (lets a test see the first line before the call can end)
"""

import json
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        if self.path != "/healthz":
            self.send_error(404)
            return
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        try:
            inputs = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            inputs = {}
        words = str(inputs.get("prompt", "hello from a stream")).split()
        delay = float(inputs.get("delay", 0.2))
        wait_for = inputs.get("waitFor")

        # Chunked transfer encoding: the length is not known up front.
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i, word in enumerate(words):
            self.chunk({"token": word, "index": i})
            if i == 0 and wait_for:
                while not os.path.exists(wait_for):
                    time.sleep(0.05)
            elif delay > 0:
                time.sleep(delay)
        self.chunk({"done": True, "tokens": len(words)})
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def chunk(self, obj):
        line = (json.dumps(obj) + "\n").encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
        self.wfile.flush()


if __name__ == "__main__":
    port = int(os.environ.get("PORT", "8000"))
    ThreadingHTTPServer((os.environ.get("HOST", "127.0.0.1"), port), Handler).serve_forever()
