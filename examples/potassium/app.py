# An unmodified Potassium app, as users bring them from Banana: it calls
# app.serve() without arguments, so it asks for 0.0.0.0:8000; inferd's protocol
# "potassium" makes it listen on 127.0.0.1:$PORT instead (docs/protocols.md).
import os
import threading
import time

from potassium import Potassium, Request, Response

app = Potassium("echo")


@app.init
def init():
    # Runs before the port opens, like loading a model onto the GPU.
    return {"loaded_at": time.time()}


@app.handler(route="/")
def handler(context: dict, request: Request) -> Response:
    inputs = request.json
    if isinstance(inputs, dict):
        if "sleep" in inputs:
            time.sleep(float(inputs["sleep"]))
        if "raise" in inputs:
            raise ValueError("bad prompt")
    return Response(
        json={
            "echo": inputs,
            "pid": os.getpid(),
            "replica": os.environ.get("INFERD_REPLICA_ID"),
            "request_id": request.id,
        },
        status=200,
    )


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
    time.sleep(float((request.json or {}).get("sleep", 0)))
    print("background done:", request.json, flush=True)


if __name__ == "__main__":
    app.serve()
