"""A test double of Banana's Potassium framework, version 0.5.0, built on Flask and
Werkzeug like the real one. inferd's tests run unmodified Potassium apps against it
because the real package cannot be installed here. It follows Potassium 0.5.0
(potassium/potassium.py, worker.py, types.py, status.py) wherever inferd depends on
the app's behaviour:

  - app.serve(host="0.0.0.0", port=8000) runs the @app.init function on the worker
    first and opens the port only after it returned a dict. An init() that raises
    prints its traceback and leaves the app running with its port never opened.
  - One worker (Potassium's default ThreadPool(1)): handler and background calls run
    one at a time, in the order they arrived. A background call holds the worker like
    any other, so a call that arrives after it waits until it has finished. The HTTP
    server itself is threaded: the status routes answer while the worker is busy.
  - POST <handler route> takes a JSON body (a body Flask's get_json refuses is 400
    with an empty body; an unknown route is 404). The handler must return a Response;
    anything else, like an exception, is a 500 with the traceback as text/plain,
    which is also printed to stdout.
  - POST <background route> answers {"started": true} at once and queues the call.
  - GET /__status__ and GET /_k/status answer
    {"gpu_available", "sequence_number", "idle_time", "inference_time"} (times in ms):
    gpu_available is false from the moment a call arrives until it has finished.
  - POST /_k/warmup answers {"warm": true} (and counts as a call, as Potassium does).
  - request.id is the X-Banana-Request-Id header (a fresh uuid without one);
    request.headers looks names up case-insensitively, "-" and "_" alike.

Left out: experimental_num_workers above 1 (a process pool), the "[requestID ...]"
prefix Potassium puts on the worker's output lines, colours, test_client(), and
streaming (a generator body is sent once the generator has finished).
"""

import functools
import inspect
import json as jsonlib
import threading
import time
import traceback
import uuid
from multiprocessing.pool import ThreadPool
from types import GeneratorType

from flask import Flask, abort, make_response
from flask import Response as FlaskResponse
from flask import request as flask_request
from werkzeug.serving import make_server

__all__ = ["Potassium", "Request", "RequestHeaders", "Response", "RouteAlreadyInUseException"]

_HANDLER = "HANDLER"
_BACKGROUND = "BACKGROUND"


class RouteAlreadyInUseException(Exception):
    pass


class RequestHeaders:
    """The request's headers; names match case-insensitively, "-" and "_" alike."""

    def __init__(self, headers):
        self._headers = {self._normalize_key(k): v for k, v in headers.items()}

    @staticmethod
    def _normalize_key(key):
        if not isinstance(key, str):
            raise KeyError(key)
        return key.upper().replace("-", "_")

    def __getitem__(self, key):
        return self._headers[self._normalize_key(key)]

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default


class Request:
    """What a handler receives: the request id, headers and decoded JSON body."""

    def __init__(self, id, headers, json):
        self.id = id
        self.headers = headers
        self.json = json


class Response:
    """What a handler returns: a JSON body (json=...) or bytes (body=...)."""

    def __init__(self, status=200, json=None, headers=None, body=None):
        assert json is None or body is None, "Potassium Response object cannot have both json and body set"
        self.headers = headers if headers is not None else {}
        if json is not None:
            self.body = jsonlib.dumps(json).encode("utf-8")
            self.headers["Content-Type"] = "application/json"
        else:
            self.body = body
        self.status = status

    @property
    def json(self):
        if type(self.body) is bytes:
            try:
                return jsonlib.loads(self.body.decode("utf-8"))
            except ValueError:
                return None
        return None

    @json.setter
    def json(self, json):
        self.body = jsonlib.dumps(json).encode("utf-8")
        self.headers["Content-Type"] = "application/json"


class _Status:
    """Potassium's PotassiumStatus for one worker, updated under a lock."""

    def __init__(self):
        self._lock = threading.Lock()
        self._received = 0  # calls accepted for the worker (and warmups)
        self._completed = 0
        self._bad = 0
        self._worker_started = False
        self._idle_since = time.time()
        self._running = {}  # internal id -> when the worker started it

    def received(self):
        with self._lock:
            self._received += 1

    def bad_request(self):
        with self._lock:
            self._bad += 1

    def worker_started(self):
        with self._lock:
            self._worker_started = True

    def start(self, internal_id):
        with self._lock:
            self._running[internal_id] = time.time()

    def end(self, internal_id):
        with self._lock:
            self._completed += 1
            self._running.pop(internal_id, None)
            if self._gpu_available():
                self._idle_since = time.time()

    def _gpu_available(self):
        return self._worker_started and self._received - self._completed < 1

    def snapshot(self):
        with self._lock:
            now = time.time()
            available = self._gpu_available()
            return {
                "gpu_available": available,
                "sequence_number": self._received + self._bad,
                "idle_time": int((now - self._idle_since) * 1000) if available else 0,
                "inference_time": int((now - min(self._running.values())) * 1000) if self._running else 0,
            }


class Potassium:
    def __init__(self, name, experimental_num_workers=1):
        if experimental_num_workers != 1:
            raise NotImplementedError("this test double of Potassium runs one worker only")
        self.name = name
        self._init_func = lambda _: {}
        self._endpoints = {}  # route -> (kind, wrapped func)
        self._context = {}
        self._status = _Status()
        self._pool = None
        self._worker_ready = threading.Event()
        self._flask_app = self._create_flask_app()

    # Decorators -----------------------------------------------------------------

    def init(self, func):
        self._init_func = func
        return func

    @staticmethod
    def _standardize_route(route):
        if route is None or len(route) == 0:
            route = "/"
        if route[0] != "/":
            route = "/" + route
        return route

    def _base_decorator(self, route, kind):
        route = self._standardize_route(route)
        if route in self._endpoints:
            raise RouteAlreadyInUseException()

        def decorator(func):
            @functools.wraps(func)
            def wrapper(context, request):
                out = func(context, request)
                if kind == _HANDLER:
                    if type(out) is not Response:
                        raise Exception("Potassium Response object not returned")
                    if type(out.body) is not bytes and type(out.body) is not GeneratorType:
                        raise Exception("Potassium Response object body must be bytes", type(out.body))
                return out

            self._endpoints[route] = (kind, wrapper)
            return wrapper

        return decorator

    def handler(self, route="/"):
        return self._base_decorator(route, _HANDLER)

    def background(self, route="/"):
        return self._base_decorator(route, _BACKGROUND)

    # The worker -----------------------------------------------------------------

    def _init_worker(self):
        """Runs init() on the worker thread, as Potassium's init_worker does."""
        try:
            if len(inspect.signature(self._init_func).parameters) == 0:
                context = self._init_func()
            else:
                context = self._init_func(0)  # the worker number
            if not isinstance(context, dict):
                raise Exception("Potassium init() must return a dictionary")
        except Exception:
            print(traceback.format_exc(), flush=True)
            return  # the worker never counts as started: serve() never opens the port
        self._context = context
        self._status.worker_started()
        self._worker_ready.set()

    def _run(self, func, req, internal_id):
        """Runs one call on the worker and returns its Response (Potassium's run_worker)."""
        self._status.start(internal_id)
        try:
            try:
                resp = func(self._context, req)
            except Exception:
                tb = traceback.format_exc()
                print(tb, flush=True)
                resp = Response(status=500, body=tb.encode("utf-8"), headers={"Content-Type": "text/plain"})
            if resp is not None and type(resp.body) is GeneratorType:
                resp.body = b"".join(resp.body)  # on the worker, as Potassium iterates it there
            return resp
        finally:
            self._status.end(internal_id)

    # Flask app ------------------------------------------------------------------

    def _create_flask_app(self):
        app = Flask(self.name)

        @app.route("/", defaults={"path": ""}, methods=["POST"])
        @app.route("/<path:path>", methods=["POST"])
        def handle(path):
            route = "/" + path
            if route not in self._endpoints:
                self._status.bad_request()
                abort(404)
            kind, func = self._endpoints[route]
            request_id = flask_request.headers.get("X-Banana-Request-Id", None)
            if request_id is None:
                request_id = str(uuid.uuid4())
            try:
                req = Request(
                    id=request_id,
                    headers=RequestHeaders(dict(flask_request.headers.items())),
                    json=flask_request.get_json(),
                )
            except Exception:
                self._status.bad_request()
                res = make_response()
                res.status_code = 400
                return res
            self._status.received()
            internal_id = str(uuid.uuid4())
            call = self._pool.apply_async(self._run, (func, req, internal_id))
            if kind == _BACKGROUND:
                return make_response({"started": True})
            resp = call.get()
            return FlaskResponse(resp.body, status=resp.status, headers=resp.headers)

        @app.route("/_k/warmup", methods=["POST"])
        def warm():
            self._status.received()
            self._status.end(str(uuid.uuid4()))
            return make_response({"warm": True})

        @app.route("/_k/status", methods=["GET"])
        @app.route("/__status__", methods=["GET"])
        def status():
            return make_response(self._status.snapshot())

        return app

    def serve(self, host="0.0.0.0", port=8000):
        print("------\nStarting Potassium Server 🍌", flush=True)
        self._pool = ThreadPool(1, self._init_worker)
        # Potassium waits until its worker has started; an init() that failed
        # leaves it waiting for good.
        self._worker_ready.wait()
        server = make_server(host, port, self._flask_app, threaded=True)
        print("Serving at http://%s:%d\n------" % (host, port), flush=True)
        server.serve_forever()
