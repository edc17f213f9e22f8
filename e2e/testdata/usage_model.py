#!/usr/bin/env python3
"""A model that reports whatever token usage it is told to, for the usage
clamping tests (e2e/doors_test.go): an OpenAI-compatible server (stdlib only)
whose chat reply's "usage" is the JSON object in the last message's content,
e.g. {"prompt_tokens": 9223372036854775807, "completion_tokens": -5}.
GET /health answers 200, GET /v1/models lists "liar".
"""

import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def send_json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self.send_json(200, {})
        elif self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": "liar", "object": "model"}]})
        else:
            self.send_json(404, {"detail": "Not Found"})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        usage = json.loads(req["messages"][-1]["content"])
        self.send_json(200, {"id": "chatcmpl-1", "object": "chat.completion", "model": req.get("model"),
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                          "finish_reason": "stop"}],
                             "usage": usage})

    def log_message(self, *args):
        pass


ThreadingHTTPServer((os.environ.get("HOST", "127.0.0.1"), int(os.environ["PORT"])), Handler).serve_forever()
