#!/usr/bin/env python3
"""A stdlib-only stand-in for vLLM's OpenAI-compatible server, for tests and
demos of inferd's OpenAI front door (docs/openai.md). It answers as
`vllm serve` does, with the same paths, JSON, Server-Sent Events, error
shapes and statuses, and no model: see README.md beside it.

It listens on $HOST:$PORT. The reply to a chat is "echo: " + the last user
message; to a completion, "echo: " + the prompt; tokens are words.
Environment: MODEL_NAME (the model it serves; unset: any name),
BOOT_SECONDS (seconds before it listens, as a model loading).
"""

import base64
import hashlib
import json
import os
import select
import socket
import struct
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = os.environ.get("MODEL_NAME", "")
MAX_MODEL_LEN = 4096  # vLLM's max_model_len: prompt + completion tokens

# How many requests of each @id were refused so far (@times), and the
# @ids held so far (@hold holds only the first request of its @id).
refused = {}
held_ids = set()
seen_lock = threading.Lock()


def first_hold(req, d):
    """Whether this request is to be held: mock_hold always; @hold the
    first time its @id comes (a client's retry of it is answered)."""
    if req.get("mock_hold"):
        return True
    if not d.get("hold"):
        return False
    with seen_lock:
        first = d.get("id", "-") not in held_ids
        held_ids.add(d.get("id", "-"))
    return first


def log(*words):
    """One line of the model's log (stderr), which inferd keeps per replica."""
    print(*words, file=sys.stderr, flush=True)


def words(text):
    return str(text).split()


def directives(text):
    """The @name=value words of a prompt (see README.md), and the text
    without them."""
    found, rest = {}, []
    for w in words(text):
        if w.startswith("@") and len(w) > 1:
            name, _, value = w[1:].partition("=")
            found[name] = value or "1"
        else:
            rest.append(w)
    return found, " ".join(rest)


def content_text(content):
    if isinstance(content, list):  # content parts
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def embedding(text, encoding_format=None):
    digest = hashlib.sha256(str(text).encode()).digest()
    vec = [round(b / 255.0, 4) for b in digest[:8]]
    if encoding_format == "base64":  # little-endian float32s, as vLLM's (numpy's tobytes)
        return base64.b64encode(struct.pack("<%df" % len(vec), *vec)).decode()
    return vec


def token_logprob(token, k, top):
    """A logprob entry of chat's shape for token, the k-th of its reply."""
    entry = {"token": token, "logprob": -0.25 * (k + 1), "bytes": list(token.encode())}
    entry["top_logprobs"] = [
        {"token": t, "logprob": -0.25 * (k + 1) - j, "bytes": list(t.encode())}
        for j, t in enumerate([token] + ["alt%d" % j for j in range(1, top)])
    ][:top]
    return entry


def tool_arguments(tool, text):
    """Arguments that fit the tool's JSON schema: each property filled in."""
    params = (tool.get("function") or {}).get("parameters") or {}
    args = {}
    for name, schema in (params.get("properties") or {}).items():
        kind = (schema or {}).get("type")
        if kind in ("number", "integer"):
            args[name] = 1
        elif kind == "boolean":
            args[name] = True
        elif kind == "array":
            args[name] = [text]
        elif kind == "object":
            args[name] = {}
        else:
            args[name] = text
    return json.dumps(args)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format, *args):
        pass

    def send_json(self, status, obj, headers=None):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def error(self, status, message, err_type=None, param=None, headers=None):
        """vLLM's error: {"error": {message, type, param, code}}, code the
        HTTP status as a number, type the exception's name (or the status's
        phrase, as vLLM's GracefulHTTPError has it)."""
        err_type = err_type or HTTPStatus(status).phrase
        self.send_json(status, {"error": {"message": message, "type": err_type, "param": param, "code": status}}, headers)

    def do_GET(self):
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/version":
            self.send_json(200, {"version": "mock"})
        elif self.path == "/v1/models":
            name = MODEL or "mock"
            self.send_json(200, {"object": "list", "data": [{
                "id": name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                "root": name, "parent": None, "max_model_len": MAX_MODEL_LEN, "permission": []}]})
        else:
            self.send_json(404, {"detail": "Not Found"})  # FastAPI's own 404

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        try:
            req = json.loads(self.rfile.read(length) or b"null")
        except ValueError:
            req = None
        if self.path not in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
            self.send_json(404, {"detail": "Not Found"})
            return
        if not isinstance(req, dict):
            self.error(400, "JSON decode error", "BadRequestError")
            return
        if MODEL and req.get("model") != MODEL:
            self.error(404, "The model `%s` does not exist." % req.get("model"), "NotFoundError", "model")
            return
        if self.path == "/v1/embeddings":
            self.embeddings(req)
            return
        chat = self.path == "/v1/chat/completions"
        if chat:
            messages = req.get("messages")
            if not isinstance(messages, list) or not messages:
                self.error(400, "messages: Field required", "BadRequestError")
                return
            prompt_text = " ".join(content_text(m.get("content")) for m in messages if isinstance(m, dict))
            last = messages[-1] if isinstance(messages[-1], dict) else {}
            user = ""
            for m in reversed(messages):
                if isinstance(m, dict) and m.get("role") == "user":
                    user = content_text(m.get("content"))
                    break
        else:
            prompt = req.get("prompt", "")
            if isinstance(prompt, list):
                prompt = " ".join(str(p) for p in prompt)
            prompt_text = user = str(prompt)
            last = {}
        d, text = directives(user)
        if not self.admit(req, d):
            return
        n = req.get("n") or 1
        if not isinstance(n, int) or n < 1:
            self.error(400, "n must be at least 1, got %s." % n, "BadRequestError", "n")
            return
        prompt_tokens = len(words(prompt_text))
        max_tokens = req.get("max_completion_tokens") or req.get("max_tokens")
        if isinstance(max_tokens, int) and prompt_tokens + max_tokens > MAX_MODEL_LEN:
            self.error(400, ("This model's maximum context length is %d tokens. However, you requested %d tokens "
                             "(%d in the messages, %d in the completion). Please reduce the length of the messages "
                             "or completion.") % (MAX_MODEL_LEN, prompt_tokens + max_tokens, prompt_tokens, max_tokens),
                       "BadRequestError")
            return
        tool = None
        tools = req.get("tools") if chat else None
        if tools and req.get("tool_choice") != "none" and last.get("role") != "tool":
            tool = tools[0]
            choice = req.get("tool_choice")
            if isinstance(choice, dict):
                wanted = (choice.get("function") or {}).get("name")
                tool = next((t for t in tools if (t.get("function") or {}).get("name") == wanted), tool)
        if chat and last.get("role") == "tool":
            reply = words("echo: tool said " + content_text(last.get("content")))
        else:
            reply = words("echo: " + text)
        finish = "stop"
        if isinstance(max_tokens, int) and 0 < max_tokens < len(reply):
            reply, finish = reply[:max_tokens], "length"
        g = Generation(self, req, d, chat, reply, finish, tool, prompt_tokens, n)
        log("run", d.get("id", "-"), self.path, "stream" if req.get("stream") else "plain")
        if req.get("stream"):
            g.stream()
        else:
            g.answer()

    def admit(self, req, d):
        """Answers the test-only refusals (mock_status, @status) and reports
        whether the request may run."""
        status = req.get("mock_status") or d.get("status")
        if not status:
            return True
        rid = d.get("id", "-")
        if "times" in d:
            with seen_lock:
                if refused.get(rid, 0) >= int(d["times"]):
                    return True
                refused[rid] = refused.get(rid, 0) + 1
        retry_after = d.get("retry_after") or req.get("mock_retry_after")
        headers = {"Retry-After": str(retry_after)} if retry_after else None
        log("refused", rid, self.path, status)
        self.error(int(status), "mock failure", headers=headers)
        return False

    def embeddings(self, req):
        inputs = req.get("input", "")
        if not isinstance(inputs, list) or (inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        if not inputs:
            self.error(400, "input: must not be empty", "BadRequestError")
            return
        texts = [" ".join(str(t) for t in i) if isinstance(i, list) else str(i) for i in inputs]
        d, _ = directives(" ".join(texts))
        if not self.admit(req, d):
            return
        fmt = req.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            self.error(400, "encoding_format: Input should be 'float' or 'base64'", "BadRequestError")
            return
        time.sleep(float(req.get("mock_delay_ms", 0)) / 1000)
        log("run", d.get("id", "-"), self.path, "plain")
        n = sum(len(words(t)) for t in texts)
        self.send_json(200, {
            "id": "embd-" + uuid.uuid4().hex, "object": "list", "created": int(time.time()), "model": req["model"],
            "data": [{"index": i, "object": "embedding", "embedding": embedding(t, fmt)} for i, t in enumerate(texts)],
            "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0, "prompt_tokens_details": None},
        })

    def held(self):
        """Waits until the client goes away, as a request the model never
        finishes; True once it has."""
        deadline = time.time() + 120
        while time.time() < deadline:
            r, _, _ = select.select([self.connection], [], [], 0.05)
            if r and not self.connection.recv(1, socket.MSG_PEEK):  # its close, not a next request
                return True
        return False

    def raw(self, data):
        """One chunk of the chunked body."""
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


class Generation:
    """One chat or completion request's answer, whole or streamed, in
    vLLM's shapes."""

    def __init__(self, h, req, d, chat, reply, finish, tool, prompt_tokens, n):
        self.h, self.req, self.d, self.chat = h, req, d, chat
        self.reply, self.finish, self.tool, self.n = reply, finish, tool, n
        self.model = req["model"]
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.delay = float(req.get("mock_delay_ms", 0)) / 1000
        if tool is not None:
            self.finish = "tool_calls"
            self.arguments = tool_arguments(tool, " ".join(reply[1:]))
            self.call_id = "chatcmpl-tool-" + uuid.uuid4().hex
            completion = len(words(self.arguments))
        else:
            completion = len(reply)
        completion *= n
        self.usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion,
                      "completion_tokens": completion, "prompt_tokens_details": None}
        top = req.get("top_logprobs") if chat else req.get("logprobs")
        self.logprobs = bool(req.get("logprobs")) if chat else isinstance(req.get("logprobs"), int)
        self.top = top if isinstance(top, int) and top > 0 else (1 if chat else 0)

    def tokens(self):
        """The reply's tokens as sent: each word after the first with its space."""
        return [w if i == 0 else " " + w for i, w in enumerate(self.reply)]

    def chat_logprobs(self, toks, start=0):
        return {"content": [token_logprob(t, start + k, self.top) for k, t in enumerate(toks)]}

    def completion_logprobs(self, toks, start=0, offset=0):
        lps = [-0.25 * (start + k + 1) for k in range(len(toks))]
        offsets, o = [], offset
        for t in toks:
            offsets.append(o)
            o += len(t)
        return {"text_offset": offsets, "token_logprobs": lps, "tokens": toks,
                "top_logprobs": [{t: lp} for t, lp in zip(toks, lps)] if self.top else None}

    def reply_choice(self, i):
        toks = self.tokens()
        text = "".join(toks)
        c = {"index": i}
        if self.chat:
            if self.tool is not None:
                c["message"] = {"role": "assistant", "reasoning_content": None, "content": None, "tool_calls": [{
                    "id": self.call_id, "type": "function",
                    "function": {"name": self.tool["function"]["name"], "arguments": self.arguments}}]}
            else:
                c["message"] = {"role": "assistant", "reasoning_content": None, "content": text, "tool_calls": []}
            c["logprobs"] = self.chat_logprobs(toks) if self.logprobs and self.tool is None else None
        else:
            c["text"] = text
            c["logprobs"] = self.completion_logprobs(toks) if self.logprobs else None
            c["prompt_logprobs"] = None
        c["finish_reason"], c["stop_reason"] = self.finish, None
        return c

    def answer(self):
        if self.d.get("drop"):
            # The server goes away mid-request, as a crashed worker's does.
            log("dropped", self.d.get("id", "-"))
            self.h.close_connection = True
            self.h.connection.shutdown(socket.SHUT_RDWR)
            return
        if first_hold(self.req, self.d):
            if self.h.held():
                log("aborted", self.d.get("id", "-"), "by the client")
                return
        time.sleep(self.delay)
        self.h.send_json(200, {
            "id": self.id, "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created, "model": self.model,
            "choices": [self.reply_choice(i) for i in range(self.n)],
            "usage": self.usage, "prompt_logprobs": None, "kv_transfer_params": None})

    def chunk(self, choices, usage=False):
        c = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
             "created": self.created, "model": self.model, "choices": choices}
        if self.include_usage:
            c["usage"] = self.usage if usage else None
        return c

    def delta(self, i, delta=None, text=None, logprobs=None, finish=None):
        if self.chat:
            return {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish, "stop_reason": None}

    def stream_events(self):
        """The stream's chunks in vLLM's order, one choice in each (n > 1
        interleaves them): a first chunk with the role (chat), then one
        per token, the last carrying its finish_reason; then, when asked
        for, the usage chunk with no choices."""
        toks = self.tokens()
        if self.chat:
            for i in range(self.n):
                yield self.chunk([self.delta(i, {"role": "assistant", "content": ""})])
        if self.tool is not None:
            name = self.tool["function"]["name"]
            a = self.arguments
            deltas = [{"tool_calls": [{"id": self.call_id, "type": "function", "index": 0, "function": {"name": name}}]}]
            deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": part}}]}
                       for part in (a[:len(a) // 3], a[len(a) // 3:2 * len(a) // 3], a[2 * len(a) // 3:])]
            for delta in deltas:
                for i in range(self.n):
                    yield self.chunk([self.delta(i, delta)])
            for i in range(self.n):
                yield self.chunk([self.delta(i, {"content": ""}, finish=self.finish)])
        else:
            offset = 0
            for k, t in enumerate(toks):
                finish = self.finish if k == len(toks) - 1 else None
                for i in range(self.n):
                    if self.chat:
                        lp = self.chat_logprobs([t], k) if self.logprobs else None
                        yield self.chunk([self.delta(i, {"content": t}, logprobs=lp, finish=finish)])
                    else:
                        lp = self.completion_logprobs([t], k, offset) if self.logprobs else None
                        yield self.chunk([self.delta(i, text=t, logprobs=lp, finish=finish)])
                offset += len(t)
        if self.include_usage:
            yield self.chunk([], usage=True)

    def stream(self):
        h = self.h
        self.include_usage = bool((self.req.get("stream_options") or {}).get("include_usage"))
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream; charset=utf-8")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        hold = first_hold(self.req, self.d)
        try:
            sent_content = False
            for c in self.stream_events():
                h.raw(b"data: " + json.dumps(c).encode() + b"\n\n")
                has_text = any((ch.get("delta") or {}).get("content") or ch.get("text") for ch in c["choices"])
                if hold and has_text and not sent_content:
                    # The model never finishes: a comment every 50 ms, so
                    # that the client's leaving is noticed.
                    deadline = time.time() + 120
                    while time.time() < deadline:
                        time.sleep(0.05)
                        h.raw(b": tick\n\n")
                sent_content = sent_content or has_text
                time.sleep(self.delay)
            h.raw(b"data: [DONE]\n\n")
            late = float(self.d.get("late_end_ms") or self.req.get("mock_late_end_ms") or 0)
            if late:
                time.sleep(late / 1000)  # the body's end comes after [DONE], in a write of its own
            h.raw(b"")  # the last chunk of chunked encoding
        except (BrokenPipeError, ConnectionResetError):
            print("stream aborted by the client", file=sys.stderr, flush=True)


def main():
    time.sleep(float(os.environ.get("BOOT_SECONDS", "0")))
    server = ThreadingHTTPServer((os.environ.get("HOST", "127.0.0.1"), int(os.environ.get("PORT", "8000"))), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
