# An unmodified Potassium app, as users bring them from Banana: it calls
# app.serve() without arguments, so it asks for 0.0.0.0:8000; inferd's protocol
# "potassium" makes it listen on 127.0.0.1:$PORT instead (docs/protocols.md).
#
# Besides echoing its inputs it has a few knobs inferd's tests use: "sleep"
# (seconds), "raise" (an exception), "hold" (wait for a file), "return_dict" (the
# mistake of returning a plain dict), and it reports how many other calls were
# running when it started (Potassium runs one at a time: always 0).
import os
import threading
import time

from potassium import Potassium, Request, Response

app = Potassium("echo")


@app.init
def init():
    # Runs before the port opens, like loading a model onto the GPU.
    return {"loaded_at": time.time(), "lock": threading.Lock(), "running": 0}


def begin(context: dict) -> int:
    """Counts this call as running; returns how many others already were."""
    with context["lock"]:
        context["running"] += 1
        return context["running"] - 1


def end(context: dict):
    with context["lock"]:
        context["running"] -= 1


def hold(spec: dict):
    """Creates the file spec["started"], then waits (up to a minute) until the
    file spec["release"] exists: a test holds a call running for as long as it
    needs to look at it."""
    open(spec["started"], "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(spec["release"]):
        if time.monotonic() > deadline:
            raise TimeoutError("nobody created " + spec["release"])
        time.sleep(0.01)


@app.handler(route="/")
def handler(context: dict, request: Request) -> Response:
    others = begin(context)
    try:
        inputs = request.json
        if isinstance(inputs, dict):
            if "sleep" in inputs:
                time.sleep(float(inputs["sleep"]))
            if "hold" in inputs:
                hold(inputs["hold"])
            if "raise" in inputs:
                raise ValueError("bad prompt")
            if "return_dict" in inputs:
                return {"echo": inputs}  # not a Response: Potassium answers 500
        return Response(
            json={
                "echo": inputs,
                "pid": os.getpid(),
                "replica": os.environ.get("INFERD_REPLICA_ID"),
                "request_id": request.id,
                "request_id_header": request.headers.get("x-banana-request-id"),
                "others_running": others,
            },
            status=200,
        )
    finally:
        end(context)


# A second handler, reached by Banana's Client SDK as client.call("/second", ...)
# (inferd: POST /run/PROJECT/second). It counts its runs in this process, so a
# test can tell that a call the SDK retried ran the model once.
_second_runs = 0
_second_lock = threading.Lock()


@app.handler(route="/second")
def second(context: dict, request: Request) -> Response:
    global _second_runs
    with _second_lock:
        _second_runs += 1
        runs = _second_runs
    return Response(json={"route": "second", "runs": runs, "echo": request.json, "request_id": request.id}, status=200)


@app.background(route="/background")
def background(context: dict, request: Request):
    begin(context)
    try:
        inputs = request.json or {}
        time.sleep(float(inputs.get("sleep", 0)))
        if "hold" in inputs:
            hold(inputs["hold"])
        print("background done:", inputs, flush=True)
    finally:
        end(context)


if __name__ == "__main__":
    app.serve()
