"""Digits model: a PyTorch model server speaking inferd's "http" protocol.

At boot it trains a small network on scikit-learn's bundled 8x8 digits data set
(1797 images, shipped inside the sklearn package: nothing is downloaded), then
serves GET /healthz (200 once trained), POST / (classify) and POST /batch
(inferd's batch protocol: many calls' images in one forward pass). It runs on
the GPU that inferd pins through CUDA_VISIBLE_DEVICES when CUDA can use it, else
on CPU. Input and output shapes are in README.md.
"""

import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
from sklearn.datasets import load_digits

PIXELS = 64        # 8x8 image, row by row
PIXEL_MAX = 16.0   # the data set's grey levels are 0..16
STEPS = int(os.environ.get("TRAIN_STEPS") or 200)
MAX_BATCH = 1024


def pick_device():
    """CUDA when inferd gave this replica a GPU and CUDA can use it; else CPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible and torch.cuda.is_available():
        return torch.device("cuda")
    if visible:
        # Simulated GPUs (gpu.simulate), a CPU-only torch build (Debian's), or
        # a driver library CUDA cannot find (replica.passEnv: LD_LIBRARY_PATH).
        why = "no CUDA in this torch build" if torch.version.cuda is None else "CUDA cannot start"
        print(f"CUDA_VISIBLE_DEVICES={visible} but CUDA is not available ({why}; "
              f"torch {torch.__version__} at {sys.executable}): using CPU", flush=True)
        if int(torch.__version__.split(".")[0]) < 2:
            print("torch < 2.0 may not accept GPU UUIDs in CUDA_VISIBLE_DEVICES: "
                  "set DIGITS_PYTHON to a Python with a CUDA-enabled torch >= 2.0", flush=True)
    return torch.device("cpu")


def train(device):
    """Trains a 64-128-10 MLP full-batch; returns it with its training accuracy."""
    torch.manual_seed(0)
    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32, device=device) / PIXEL_MAX
    y = torch.tensor(data.target, dtype=torch.long, device=device)
    net = torch.nn.Sequential(
        torch.nn.Linear(PIXELS, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    ).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(STEPS):
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
    net.eval()
    with torch.no_grad():
        acc = (net(x).argmax(dim=1) == y).float().mean().item()
    return net, acc, loss.item()


def parse_images(inputs):
    """Returns (list of 64-value rows, batched?) or raises ValueError."""
    if "pixels" in inputs:
        rows, batched = [inputs["pixels"]], False
    elif "images" in inputs:
        rows, batched = inputs["images"], True
        if not isinstance(rows, list) or not 1 <= len(rows) <= MAX_BATCH:
            raise ValueError(f"images must be a list of 1 to {MAX_BATCH} images")
    else:
        raise ValueError('inputs need "pixels" (one image) or "images" (a list of images)')
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != PIXELS:
            raise ValueError(f"image {i}: want a list of {PIXELS} numbers (8x8, row by row)")
        for v in row:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= PIXEL_MAX:
                raise ValueError(f"image {i}: pixel values must be numbers from 0 to 16")
    return rows, batched


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # see examples/echo/server.py
    net = None
    device = None

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
            self.reply(200, {"ok": True, "device": str(self.device)})
        else:
            self.reply(404, {"error": "not found"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length))
        except ValueError as e:
            self.reply(400, {"error": f"not JSON: {e}"})
            return
        if self.path == "/batch":
            self.batch(body)
            return
        try:
            rows, batched = parse_call(body)
        except ValueError as e:
            self.reply(400, {"error": str(e)})
            return
        self.reply(200, self.answer(self.classify(rows), batched))

    def batch(self, body):
        """inferd's batch: {"batch": [inputs, ...]} answered with
        {"outputs": [...]}, every call's images in one forward pass, and a
        call with bad inputs answered {"error": ...} alone."""
        calls = body.get("batch") if isinstance(body, dict) else None
        if not isinstance(calls, list):
            self.reply(400, {"error": 'want {"batch": [inputs, ...]}'})
            return
        rows, parts = [], []  # parts: (first row, rows, batched) or the error
        for inputs in calls:
            try:
                mine, batched = parse_call(inputs)
            except ValueError as e:
                parts.append(str(e))
                continue
            parts.append((len(rows), len(mine), batched))
            rows.extend(mine)
        probs = self.classify(rows) if rows else None
        outputs = []
        for part in parts:
            if isinstance(part, str):
                outputs.append({"error": part})
                continue
            first, n, batched = part
            outputs.append(self.answer(probs[first:first + n], batched))
        self.reply(200, {"outputs": outputs})

    def classify(self, rows):
        """One forward pass over rows; the softmax per row, on the CPU."""
        x = torch.tensor(rows, dtype=torch.float32, device=self.device) / PIXEL_MAX
        with torch.no_grad():
            return torch.softmax(self.net(x), dim=1).cpu()

    def answer(self, probs, batched):
        digits = probs.argmax(dim=1).tolist()
        if batched:
            return {"digits": digits, "device": self.device.type}
        return {
            "digit": digits[0],
            "probabilities": [round(p, 4) for p in probs[0].tolist()],
            "device": self.device.type,
        }


def parse_call(inputs):
    """One call's inputs: (rows, batched) or ValueError."""
    if not isinstance(inputs, dict):
        raise ValueError("inputs must be a JSON object")
    return parse_images(inputs)


def main():
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    # Replicas share the box's cores; one thread is also the fastest for a net this small.
    torch.set_num_threads(int(os.environ.get("TORCH_THREADS") or 1))
    device = pick_device()
    t0 = time.monotonic()
    net, acc, loss = train(device)
    print(f"trained {STEPS} steps on {device} in {time.monotonic() - t0:.2f}s: "
          f"loss {loss:.4f}, training accuracy {acc:.4f}", flush=True)
    Handler.net, Handler.device = net, device

    port = int(os.environ["PORT"])
    with ThreadingHTTPServer(("127.0.0.1", port), Handler) as server:
        print(f"digits model listening on 127.0.0.1:{port}", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()
