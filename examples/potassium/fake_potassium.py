"""A test double of Banana's Potassium framework (0.5), built on Flask and Werkzeug
like the real one, speaking the same protocol. inferd's tests run unmodified
Potassium apps against it because the real package cannot be installed here.

The protocol (see docs/protocols.md):
  - app.serve(host="0.0.0.0", port=8000) runs the @app.init function first and only
    then opens the port.
  - GET /__status__ and GET /_k/status answer
    {"gpu_available", "sequence_number", "idle_time", "inference_time"} (times in ms).
  - POST <handler route> takes a JSON body; a body that is not JSON is 400 with an
    empty body; a handler exception is 500 with the traceback as text/plain (also
    printed to stderr); otherwise the handler's Response.
  - POST /_k/warmup answers {"warm": true}.
  - POST <background route> answers {"started": true} at once and runs the handler
    in a thread.
  - The request id comes from the X-Banana-Request-Id header.
"""

import json as _json
import sys
import threading
import time
import traceback
import uuid

from flask import Flask, make_response
from flask import request as flask_request
from werkzeug.serving import make_server

__all__ = ["Potassium", "Request", "Response"]


def _now_ms():
    return int(time.monotonic() * 1000)


class Request:
    """What a handler receives: the request id and the decoded JSON body."""

    def __init__(self, id, headers, json):
        self.id = id
        self.headers = headers
        self.json = json


class Response:
    """What a handler returns: a JSON body (json=...) or raw bytes (body=...)."""

    def __init__(self, status=200, json=None, headers=None, body=None):
        self.status = status
        self.json = json
        self.headers = dict(headers or {})
        self.body = body


class Potassium:
    def __init__(self, name):
        self.name = name
        self._init_func = None
        self._endpoints = {}  # route -> (kind, func)
        self._context = {}
        self._lock = threading.Lock()
        self._in_flight = 0
        self._sequence_number = 0
        self._idle_since = _now_ms()
        self._busy_since = None
        self._flask = None

    # Decorators -----------------------------------------------------------------

    def init(self, func):
        self._init_func = func
        return func

    def handler(self, route="/"):
        def deco(func):
            self._endpoints[route] = ("handler", func)
            return func

        return deco

    def background(self, route="/"):
        def deco(func):
            self._endpoints[route] = ("background", func)
            return func

        return deco

    # Bookkeeping ----------------------------------------------------------------

    def _begin(self):
        with self._lock:
            self._sequence_number += 1
            if self._in_flight == 0:
                self._busy_since = _now_ms()
            self._in_flight += 1

    def _end(self):
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle_since = _now_ms()
                self._busy_since = None

    def _status(self):
        with self._lock:
            now = _now_ms()
            busy = self._in_flight > 0
            return {
                "gpu_available": not busy,
                "sequence_number": self._sequence_number,
                "idle_time": 0 if busy else now - self._idle_since,
                "inference_time": now - self._busy_since if busy else 0,
            }

    # Flask app ------------------------------------------------------------------

    def _parse(self):
        """The potassium Request, or None when the body is not JSON."""
        try:
            body = _json.loads(flask_request.get_data() or b"")
        except ValueError:
            return None
        rid = flask_request.headers.get("X-Banana-Request-Id") or str(uuid.uuid4())
        return Request(id=rid, headers=dict(flask_request.headers), json=body)

    def _endpoint(self, route, kind, func):
        def view():
            req = self._parse()
            if req is None:
                return make_response("", 400)
            if kind == "background":
                def run():
                    self._begin()
                    try:
                        func(self._context, req)
                    except Exception:
                        print(traceback.format_exc(), file=sys.stderr, flush=True)
                    finally:
                        self._end()

                threading.Thread(target=run, daemon=True).start()
                return _flask_json({"started": True}, 200)
            self._begin()
            try:
                out = func(self._context, req)
            except Exception:
                tb = traceback.format_exc()
                print(tb, file=sys.stderr, flush=True)
                res = make_response(tb, 500)
                res.headers["Content-Type"] = "text/plain"
                return res
            finally:
                self._end()
            if not isinstance(out, Response):
                out = Response(json=out)
            if out.body is not None:
                res = make_response(out.body, out.status)
            else:
                res = _flask_json(out.json, out.status)
            for k, v in out.headers.items():
                res.headers[k] = v
            return res

        view.__name__ = "endpoint_" + kind + "_" + route.strip("/").replace("/", "_")
        return view

    def _create_flask_app(self):
        app = Flask(self.name)
        for route, (kind, func) in self._endpoints.items():
            app.add_url_rule(route, view_func=self._endpoint(route, kind, func), methods=["POST"])

        def status():
            return _flask_json(self._status(), 200)

        app.add_url_rule("/__status__", "status", status, methods=["GET"])
        app.add_url_rule("/_k/status", "k_status", status, methods=["GET"])

        def warmup():
            return _flask_json({"warm": True}, 200)

        app.add_url_rule("/_k/warmup", "k_warmup", warmup, methods=["POST"])
        return app

    def serve(self, host="0.0.0.0", port=8000):
        if self._init_func is not None:
            self._context = self._init_func() or {}
        self._flask = self._create_flask_app()
        server = make_server(host, port, self._flask, threaded=True)
        print("------\nStarting Potassium server 🍌 on port %d\n------" % port, flush=True)
        server.serve_forever()


def _flask_json(obj, status):
    res = make_response(_json.dumps(obj), status)
    res.headers["Content-Type"] = "application/json"
    return res
