"""gpuprobe: a model server that reports what GPUs it can reach.

For checking inferd on a real GPU box (docs/gpu.md, "How to verify on a GPU
box"). It speaks inferd's "http" protocol: GET /healthz, POST / answers

  {"cudaVisibleDevices": "...",   # what inferd pinned this replica to
   "torch": "2.3.1+cu121" | null, # null: no torch in this interpreter
   "torchDevices": 1,             # CUDA devices torch sees as pinned
   "torchDevicesUnset": 8,        # ... in a child that unsets CUDA_VISIBLE_DEVICES
   "nvidiaSmi": ["GPU 0: ...", ...],  # nvidia-smi -L (NVML ignores the pinning)
   "allocatedMiB": 0}

ALLOC_MIB=N makes it allocate N MiB of GPU memory at boot and hold it (needs
a CUDA-enabled torch), to play a replica that uses more or less than its
gpuMemoryMiB. Only the standard library is needed otherwise.
"""

import json
import os
import subprocess
import sys
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
        "allocatedMiB": ALLOCATED,
    }


def allocate(mib):
    """Holds mib MiB of GPU memory for the life of the process."""
    if mib <= 0:
        return 0, None
    import torch
    block = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
    block.fill_(1)  # touch it: the driver counts it as used
    return mib, block


ALLOCATED, _BLOCK = allocate(int(os.environ.get("ALLOC_MIB") or 0))


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
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.reply(200, probe())


def main():
    port = int(os.environ.get("PORT", "8000"))
    server = ThreadingHTTPServer((os.environ.get("HOST", "127.0.0.1"), port), Handler)
    print(f"gpuprobe listening on {port}: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}, "
          f"holding {ALLOCATED} MiB", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
