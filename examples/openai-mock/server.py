#!/usr/bin/env python3
"""A stdlib-only OpenAI-compatible server, for tests and demos of inferd's
OpenAI front door (docs/openai.md). It is a stand-in for vLLM or llama.cpp's
server: same paths, same JSON, same Server-Sent Events, no model.

It listens on $HOST:$PORT and answers
  GET  /v1/models, /health
  POST /v1/chat/completions  the reply is "echo: " + the last user message
  POST /v1/completions       the reply is "echo: " + the prompt
  POST /v1/embeddings        8 numbers per input, from its SHA-256 (as
                             base64 float32s with encoding_format base64)
Tokens are words. A request with "stream": true gets one chunk per word
(chat: choices[0].delta.content; completions: choices[0].text), the final
chunk with finish_reason, then, with stream_options.include_usage, a chunk
with "choices": [] and the usage, then data: [DONE]. Every reply and the
usage chunk carry "usage" as OpenAI's do.

Environment:
  MODEL_NAME    the model it serves; a request naming another gets OpenAI's
                404 model_not_found (vLLM does the same). Unset: any name.
  BOOT_SECONDS  seconds to wait before listening (a model loading).

Test-only request fields (ignored by real servers, passed on by inferd):
  mock_delay_ms  wait this long before answering, and between chunks
  mock_hold      stream: after the first chunk, keep the stream open
                 (a comment every 50 ms) until the client goes away; then
                 print "stream aborted by the client" to stderr
  mock_status    answer this HTTP status with an OpenAI error body
  mock_retry_after  with mock_status, send this Retry-After header
"""

import base64
import hashlib
import json
import os
import struct
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = os.environ.get("MODEL_NAME", "")


def words(text):
    return str(text).split()


def last_user_message(messages):
    for m in reversed(messages or []):
        if isinstance(m, dict) and m.get("role") == "user":
            c = m.get("content", "")
            if isinstance(c, list):  # content parts
                c = " ".join(p.get("text", "") for p in c if isinstance(p, dict))
            return str(c)
    return ""


def embedding(text, encoding_format=None):
    digest = hashlib.sha256(str(text).encode()).digest()
    vec = [round(b / 255.0, 4) for b in digest[:8]]
    if encoding_format == "base64":  # little-endian float32s, as OpenAI's (the JS SDK asks for it)
        return base64.b64encode(struct.pack("<%df" % len(vec), *vec)).decode()
    return vec


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format, *args):
        pass

    def send_json(self, status, obj, headers=None):
        body = json.dumps(obj).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def error(self, status, message, code=None, param=None, headers=None):
        self.send_json(status, {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}, headers)

    def do_GET(self):
        if self.path == "/health":
            self.send_json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": MODEL or "mock", "object": "model", "created": 0, "owned_by": "mock"}]})
        else:
            self.error(404, "no such path: " + self.path)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        try:
            req = json.loads(self.rfile.read(length) or b"null")
        except ValueError:
            req = None
        if not isinstance(req, dict):
            self.error(400, "the body must be a JSON object")
            return
        if MODEL and req.get("model") != MODEL:
            self.error(404, "The model `%s` does not exist." % req.get("model"), code="model_not_found", param="model")
            return
        if req.get("mock_status"):
            headers = {"Retry-After": str(req["mock_retry_after"])} if req.get("mock_retry_after") else None
            self.error(int(req["mock_status"]), "mock failure", code="mock", headers=headers)
            return
        delay = float(req.get("mock_delay_ms", 0)) / 1000
        if self.path == "/v1/embeddings":
            inputs = req.get("input", "")
            if not isinstance(inputs, list):
                inputs = [inputs]
            time.sleep(delay)
            n = sum(len(words(i)) for i in inputs)
            self.send_json(200, {
                "object": "list", "model": req["model"],
                "data": [{"object": "embedding", "index": i, "embedding": embedding(t, req.get("encoding_format"))} for i, t in enumerate(inputs)],
                "usage": {"prompt_tokens": n, "total_tokens": n},
            })
            return
        chat = self.path == "/v1/chat/completions"
        if not chat and self.path != "/v1/completions":
            self.error(404, "no such path: " + self.path)
            return
        if chat:
            prompt = " ".join(str(m.get("content", "")) for m in req.get("messages") or [] if isinstance(m, dict))
            reply = words("echo: " + last_user_message(req.get("messages")))
        else:
            prompt = str(req.get("prompt", ""))
            reply = words("echo: " + prompt)
        usage = {"prompt_tokens": len(words(prompt)), "completion_tokens": len(reply),
                 "total_tokens": len(words(prompt)) + len(reply)}
        ident = ("chatcmpl-" if chat else "cmpl-") + hashlib.sha256(json.dumps(req).encode()).hexdigest()[:12]
        obj = "chat.completion" if chat else "text_completion"
        if req.get("stream"):
            self.stream(req, chat, ident, obj, reply, usage, delay)
            return
        time.sleep(delay)
        text = " ".join(reply)
        choice = {"index": 0, "finish_reason": "stop"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        self.send_json(200, {"id": ident, "object": obj, "created": int(time.time()), "model": req["model"],
                             "choices": [choice], "usage": usage})

    def stream(self, req, chat, ident, obj, reply, usage, delay):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        base = {"id": ident, "object": obj + ".chunk", "created": int(time.time()), "model": req["model"]}
        if include_usage:
            base["usage"] = None

        def choice(word, finish=None):
            c = {"index": 0, "finish_reason": finish}
            if chat:
                c["delta"] = {"content": word} if word is not None else {}
            else:
                c["text"] = word or ""
            return c

        try:
            for i, word in enumerate(reply):
                self.event(dict(base, choices=[choice(("" if i == 0 else " ") + word)]))
                if i == 0 and req.get("mock_hold"):
                    deadline = time.time() + 120
                    while time.time() < deadline:
                        time.sleep(0.05)
                        self.raw(b": tick\n\n")
                time.sleep(delay)
            self.event(dict(base, choices=[choice(None, "stop")]))
            if include_usage:
                self.event(dict(base, choices=[], usage=usage))
            self.raw(b"data: [DONE]\n\n")
            self.raw(b"")  # the last chunk of chunked encoding
        except (BrokenPipeError, ConnectionResetError):
            print("stream aborted by the client", file=sys.stderr, flush=True)

    def event(self, obj):
        self.raw(b"data: " + json.dumps(obj).encode() + b"\n\n")

    def raw(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def main():
    time.sleep(float(os.environ.get("BOOT_SECONDS", "0")))
    server = ThreadingHTTPServer((os.environ.get("HOST", "127.0.0.1"), int(os.environ.get("PORT", "8000"))), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
