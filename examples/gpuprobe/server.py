"""gpuprobe: a model server that reports what GPUs it can reach.

For checking inferd on a real GPU box (docs/gpu.md, "How to verify on a GPU
box"). It speaks inferd's "http" protocol: GET /healthz, POST / answers

  {"cudaVisibleDevices": "...",   # what inferd pinned this replica to
   "torch": "2.3.1+cu121" | null, # null: no torch in this interpreter
   "torchDevices": 1,             # CUDA devices torch sees as pinned
   "torchDevicesUnset": 8,        # ... in a child that unsets CUDA_VISIBLE_DEVICES
   "nvidiaSmi": ["GPU 0: ...", ...],  # nvidia-smi -L (NVML ignores the pinning)
   "nodes": {"/dev/nvidia0": "ok", "/dev/nvidia1": "EPERM", ...},  # opening each NVIDIA node
   "allocatedMiB": 0,
   "pid": 2,               # as the replica's own PID namespace numbers it
   "bootId": "9f2c..."}    # drawn at start: the same process gives the same

ALLOC_MIB=N makes it allocate N MiB of GPU memory at boot and hold it (needs
a CUDA-enabled torch), to play a replica that uses more or less than its
gpuMemoryMiB, or a model's weights for parking (docs/gpu.md "Parking").
Only the standard library is needed otherwise.

Two quick calls skip the probe (scripts/gpu-check.sh uses them):

  {"touch": true}   sums the held block on its device: the same checksum
                    before and after a park shows the memory came back
                    {"checksum": N, "allocatedMiB": N, "device": "cuda", "pid": ..., "bootId": ..., "ms": ...}
  {"matmul": 2048, "seconds": 1.0}
                    multiplies 2048x2048 float32 matrices on its device (the
                    GPU when pinned to one and CUDA works, else the CPU) for
                    about that long: {"device", "iterations", "ms", "tflops"}
"""

import errno
import glob
import json
import os
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COUNT = "import torch; print(torch.cuda.device_count())"


def torch_devices(env):
    """CUDA devices a fresh interpreter with env sees, or None without torch."""
    try:
        out = subprocess.run([sys.executable, "-c", COUNT], env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip().isdigit() else None


def nvidia_smi():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [f"nvidia-smi: {e}"]
    return out.stdout.splitlines() or out.stderr.splitlines()


def nodes():
    """Opens each NVIDIA device node: "ok", or why not (EPERM: the device
    cgroup refused it)."""
    out = {}
    for path in sorted(glob.glob("/dev/nvidia*") + glob.glob("/dev/nvidia-caps/*")):
        if os.path.isdir(path):
            continue
        try:
            os.close(os.open(path, os.O_RDWR))
            out[path] = "ok"
        except OSError as e:
            out[path] = errno.errorcode.get(e.errno, str(e.errno))
    return out


def device():
    """The torch device calls run on: CUDA when pinned to a GPU and usable."""
    import torch
    if os.environ.get("CUDA_VISIBLE_DEVICES") and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def touch():
    """Sums the held block where it lives (0 MiB held: checksum 0)."""
    start = time.monotonic()
    checksum = int(_BLOCK.sum().item()) if _BLOCK is not None else 0
    return {"checksum": checksum, "allocatedMiB": ALLOCATED, "pid": os.getpid(), "bootId": BOOT_ID,
            "device": str(_BLOCK.device.type) if _BLOCK is not None else None,
            "ms": round((time.monotonic() - start) * 1000, 3)}


def matmul(n, seconds):
    """n x n float32 matmuls on device() for about seconds: a fixed load to
    time and to read the energy counter around."""
    import torch
    dev = device()
    a = torch.rand(n, n, device=dev)
    b = torch.rand(n, n, device=dev)
    iterations, start = 0, time.monotonic()
    while True:
        c = a @ b
        iterations += 1
        if dev.type == "cuda" and iterations % 16:
            continue  # sync now and then only: launches queue up
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if time.monotonic() - start >= seconds:
            break
    took = time.monotonic() - start
    del c
    return {"device": dev.type, "iterations": iterations, "ms": round(took * 1000, 3), "pid": os.getpid(), "bootId": BOOT_ID,
            "tflops": round(2 * n ** 3 * iterations / took / 1e12, 3)}


def probe():
    unset = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    try:
        import torch
        version = torch.__version__
    except ImportError:
        version = None
    return {
        "cudaVisibleDevices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "torch": version,
        "torchDevices": torch_devices(dict(os.environ)) if version else None,
        "torchDevicesUnset": torch_devices(unset) if version else None,
        "nvidiaSmi": nvidia_smi(),
        "nodes": nodes(),
        "allocatedMiB": ALLOCATED,
        "pid": os.getpid(),
        "bootId": BOOT_ID,
    }


def allocate(mib):
    """Holds mib MiB of GPU memory for the life of the process."""
    if mib <= 0:
        return 0, None
    import torch
    block = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
    block.fill_(1)  # touch it: the driver counts it as used
    block[::4096] = 7  # a pattern: memory that came back zeroed sums to something else
    return mib, block


ALLOCATED, _BLOCK = allocate(int(os.environ.get("ALLOC_MIB") or 0))
BOOT_ID = os.urandom(8).hex()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

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
        try:
            inputs = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        except ValueError as e:
            self.reply(400, {"error": f"not JSON: {e}"})
            return
        inputs = inputs if isinstance(inputs, dict) else {}
        try:
            if inputs.get("touch"):
                self.reply(200, touch())
            elif inputs.get("matmul"):
                self.reply(200, matmul(int(inputs["matmul"]), float(inputs.get("seconds", 1.0))))
            else:
                self.reply(200, probe())
        except (ImportError, RuntimeError, ValueError) as e:
            self.reply(500, {"error": f"{type(e).__name__}: {e}"})


def main():
    port = int(os.environ.get("PORT", "8000"))
    server = ThreadingHTTPServer((os.environ.get("HOST", "127.0.0.1"), port), Handler)
    print(f"gpuprobe listening on {port}: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}, "
          f"holding {ALLOCATED} MiB", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
