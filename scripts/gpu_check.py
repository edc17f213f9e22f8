#!/usr/bin/env python3
"""The GPU check of issue #34, run by scripts/gpu-check.sh: inferd on a real GPU
box, item by item, written up as Markdown for docs/gpu.md.

  1. discovery: inferd doctor and /v1/status/gpus against nvidia-smi
  2. examples/digits on CUDA: its pid on its GPU in nvidia-smi; run time per
     call on the GPU and on the CPU, side by side
  3. containment: CUDA works in a GPU replica's sandbox (its own uid, device
     rules, private network); a CPU replica opens no /dev/nvidia* node; two
     shares of one GPU placed by the driver's free memory, memory held by a
     process inferd did not start included
  4. energy: the GPU's total-energy counter around each call
  5. parking: VRAM freed, time to park, time to the first answer after a
     restore against a cold boot of the same model
  6. a GPU model in an OCI image (docs/images.md): the image holds python's
     standard library and no CUDA; inferd binds its GPU's nodes and the
     driver's libraries in, and cuInit answers from inside the image

Standard library only: the device box has python3 with a CUDA torch and
nothing else to count on. With --dry-run it runs on simulated GPUs
(gpu.simulate) and reports what needs a real driver as SKIPPED: the e2e
test TestGPUCheckScriptDryRun runs it so on every make test.
"""

import argparse
import ctypes
import datetime
import json
import os
import platform
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIPPED"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class OutOfTime(Exception):
    """The script's time budget is spent."""


class Clock:
    """The run's time budget: every wait asks it how long it may take."""

    def __init__(self, budget):
        self.start = time.monotonic()
        self.end = self.start + budget

    def left(self):
        return self.end - time.monotonic()

    def bound(self, want):
        left = self.left()
        if left <= 1:
            raise OutOfTime(f"the {self.end - self.start:.0f}s budget is spent")
        return min(want, left)

    def elapsed(self):
        return time.monotonic() - self.start


# --- the report -----------------------------------------------------------


class Item:
    """One numbered item of the issue: its checks, each PASS, FAIL or SKIPPED
    with a line saying what was seen, and free text (tables)."""

    def __init__(self, number, title):
        self.number, self.title = number, title
        self.checks = []  # (status, text)
        self.notes = []

    def check(self, status, text):
        self.checks.append((status, text))
        print(f"  [{status}] {self.number}: {text}", flush=True)

    def ok(self, cond, text, why=""):
        """PASS when cond holds, else FAIL with why."""
        self.check(PASS if cond else FAIL, text if cond or not why else f"{text}: {why}")
        return cond

    def note(self, text):
        self.notes.append(text)

    def status(self):
        got = [s for s, _ in self.checks]
        if FAIL in got:
            return FAIL
        if PASS in got:
            return PASS
        return SKIP


class Report:
    def __init__(self, dry):
        self.dry = dry
        self.facts = []  # (name, value) about the box
        self.items = {}
        for n, title in [(1, "Discovery: inferd doctor and /v1/status against nvidia-smi"),
                         (2, "examples/digits on CUDA through /start/v4"),
                         (3, "Containment on a GPU box"),
                         (4, "Energy: the GPU's total-energy counter per call"),
                         (5, "Parking: checkpoint an idle GPU replica, restore it on a call"),
                         (6, "A GPU model in an image: its device nodes and the driver's libraries")]:
            self.items[n] = Item(n, title)
        self.data = {}  # raw figures, written beside the report as JSON

    def fact(self, name, value):
        self.facts.append((name, value))
        print(f"  {name}: {value}", flush=True)

    def failed(self):
        return any(i.status() == FAIL for i in self.items.values())

    def markdown(self):
        mode = "dry run on simulated GPUs: what needs a real driver is SKIPPED" if self.dry else "real GPU"
        out = [f"### GPU check, {datetime.date.today().isoformat()} ({mode})", ""]
        out += [f"- {name}: {value}" for name, value in self.facts]
        out += ["", "| # | item | result |", "|---|---|---|"]
        out += [f"| {i.number} | {i.title} | **{i.status()}** |" for i in self.items.values()]
        for i in self.items.values():
            out += ["", f"#### {i.number}. {i.title}: {i.status()}", ""]
            out += [f"- {s}: {t}" for s, t in i.checks] or ["- nothing was checked"]
            for n in i.notes:
                out += ["", n]
        cmd = "scripts/gpu-check.sh --dry-run --inferd bin/inferd" if self.dry else "sudo OUT=/tmp/out scripts/gpu-check.sh --inferd bin/inferd"
        out += ["", f"Reproduce: `{cmd}` (docs/gpu.md, \"How to verify on a GPU box\")."]
        return "\n".join(out) + "\n"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join("–" if c is None else str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def ms(v):
    """A zerolog duration (ms, a float) as "12.3 ms"; "–" without one."""
    return "–" if v is None else f"{v:.1f} ms"


# --- the box --------------------------------------------------------------


def run(argv, timeout=60, **kw):
    """Runs argv; returns (exit status, stdout, stderr); 127 when missing."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
        return p.returncode, p.stdout, p.stderr
    except FileNotFoundError as e:
        return 127, "", str(e)
    except OSError as e:  # not executable, or not by the user asked for
        return 126, "", str(e)
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]} timed out after {timeout}s"


def smi_gpus():
    """nvidia-smi's GPUs: index, uuid, name, memory (MiB), MIG mode, driver."""
    code, out, err = run(["nvidia-smi", "--query-gpu=index,uuid,name,memory.total,memory.used,memory.free,mig.mode.current,driver_version",
                          "--format=csv,noheader,nounits"])
    if code != 0:
        raise RuntimeError(f"nvidia-smi failed ({code}): {err.strip() or out.strip()}")
    gpus = []
    for line in out.strip().splitlines():
        f = [x.strip() for x in line.split(",")]
        gpus.append({"index": int(f[0]), "uuid": f[1], "name": f[2], "totalMiB": int(f[3]), "usedMiB": int(f[4]),
                     "freeMiB": int(f[5]), "mig": f[6], "driver": f[7]})
    return gpus


def smi_apps():
    """nvidia-smi's compute processes: pid → (GPU uuid, MiB used)."""
    code, out, _ = run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"])
    apps = {}
    if code == 0:
        for line in out.strip().splitlines():
            f = [x.strip() for x in line.split(",")]
            if len(f) == 3 and f[0].isdigit():
                apps[int(f[0])] = (f[1], int(f[2]) if f[2].isdigit() else 0)
    return apps


def smi_used(uuid):
    for g in smi_gpus():
        if g["uuid"] == uuid:
            return g["usedMiB"]
    return None


class NVML:
    """The total-energy counter through libnvidia-ml.so.1 (ctypes): nothing
    but the driver is needed."""

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit failed")

    def energy_mj(self, uuid):
        h = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(h)) != 0:
            return None
        v = ctypes.c_ulonglong()
        if self.lib.nvmlDeviceGetTotalEnergyConsumption(h, ctypes.byref(v)) != 0:
            return None
        return v.value


def proc_status(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return line.split()[1:]
    except OSError:
        pass
    return None


def group_pids(pgid):
    """The host's pids in process group pgid: a replica's (its init leads
    the group, and the model stays in it)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getpgid(int(name)) == pgid:
                    out.append(int(name))
            except OSError:
                pass
    return out


def model_pid(init_pid):
    """The host's pid of a replica's model: its init's child (the init is
    process 1 of the replica's PID namespace), or the init itself where the
    replica has no namespace of its own. The model answers with the pid its
    namespace gives it, which the host does not know."""
    try:
        for task in os.listdir(f"/proc/{init_pid}/task"):
            with open(f"/proc/{init_pid}/task/{task}/children") as f:
                kids = f.read().split()
            if kids:
                return int(kids[0])
    except OSError:
        pass
    return init_pid


def rss_mib(pid):
    v = proc_status(pid, "VmRSS")
    return int(v[0]) // 1024 if v else None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- inferd ---------------------------------------------------------------


class Daemon:
    """One `inferd serve` on a fresh data dir, its API over HTTP, its CLI."""

    def __init__(self, binary, work, clock, config_extra, env):
        self.binary, self.work, self.clock = binary, work, clock
        self.cfg = os.path.join(work, "config.yaml")
        self.log_path = os.path.join(work, "inferd.log")
        port = free_port()
        with open(self.cfg, "w") as f:
            f.write(f"listen: 127.0.0.1:{port}\ndataDir: {work}/data\nstartWait: 170s\nlongPollWait: 60s\n"
                    f"log:\n  format: json\n  level: info\n{config_extra}")
        self.base = f"http://127.0.0.1:{port}"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([binary, "--config", self.cfg, "serve"], stdout=self.log, stderr=self.log,
                                     env=env, start_new_session=True)
        self.wait_log('"inferd serving"', 60, what="inferd to serve")
        self.admin = self.key("admin", admin=True)
        self.team = self.key("gpucheck")

    def lines(self):
        with open(self.log_path) as f:
            return f.read().splitlines()

    def wait_log(self, text, timeout, what=None, after=0, project=None):
        """Waits for a log line holding text (and "project":project), from
        line number after on; returns (the line parsed, its number)."""
        deadline = time.monotonic() + self.clock.bound(timeout)
        while True:
            lines = self.lines()
            for n in range(after, len(lines)):
                if text in lines[n] and (project is None or f'"project":"{project}"' in lines[n]):
                    try:
                        return json.loads(lines[n]), n
                    except ValueError:
                        return {}, n
            if self.proc.poll() is not None:
                raise RuntimeError(f"inferd exited ({self.proc.returncode}) waiting for {what or text}; log: {self.log_path}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no log line {text!r} within {timeout}s ({what or ''})")
            time.sleep(0.1)

    def cli(self, *args, check=True, timeout=120):
        code, out, err = run([self.binary, "--config", self.cfg, *args], timeout=self.clock.bound(timeout))
        if check and code != 0:
            raise RuntimeError(f"inferd {' '.join(args)} failed ({code}): {err.strip() or out.strip()}")
        return out + err

    def key(self, team, admin=False):
        out = self.cli("key", "create", "--team", team, *(["--admin"] if admin else []))
        return out.strip().splitlines()[-1]

    def apply(self, manifest):
        path = os.path.join(self.work, f"manifest-{time.monotonic_ns()}.yaml")
        with open(path, "w") as f:
            f.write(manifest)
        return self.cli("apply", "-f", path)

    def delete(self, project):
        self.cli("project", "delete", project)
        self.wait(lambda: not self.replicas(project), 60, f"{project}'s replicas to stop")

    def http(self, method, path, body=None, key=None, timeout=180):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", "X-Service-API-Key": key or self.admin})
        try:
            with urllib.request.urlopen(req, timeout=self.clock.bound(timeout)) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def call(self, model_key, inputs, start_only=False, timeout=180):
        """A /start/v4 call; returns (its answer, wall seconds, the call's record)."""
        t0 = time.monotonic()
        body = {"id": "gpu-check", "created": int(time.time()), "apiKey": self.team, "modelKey": model_key,
                "startOnly": start_only, "modelInputs": inputs}
        ans = self.http("POST", "/start/v4", body, timeout=timeout)
        wall = time.monotonic() - t0
        if not isinstance(ans, dict):
            raise RuntimeError(f"start answered {ans!r}")
        if not start_only and ans.get("message") != "success":
            raise RuntimeError(f"call to {model_key}: {ans.get('message') or ans}")
        return ans, wall

    def wait_call(self, call_id, timeout=180):
        deadline = time.monotonic() + self.clock.bound(timeout)
        while True:
            ans = self.http("POST", "/check/v4", {"apiKey": self.team, "callID": call_id, "longPoll": True}, timeout=70)
            msg = ans.get("message", "") if isinstance(ans, dict) else ""
            if msg == "success" or msg.startswith("error"):
                return ans
            if time.monotonic() > deadline:
                raise TimeoutError(f"call {call_id} still {msg!r} after {timeout}s")

    def check(self, call_id):
        return self.http("POST", "/check/v4", {"apiKey": self.team, "callID": call_id})

    def project(self, pid):
        st = self.http("GET", "/v1/status/projects")
        for p in st.get("results", []):
            if p["id"] == pid:
                return p
        return None

    def replicas(self, project):
        p = self.project(project)
        return p["replicas"] if p else []

    def gpus(self):
        return self.http("GET", "/v1/status/gpus").get("results", [])

    def status(self):
        return self.http("GET", "/v1/status")

    def metrics(self):
        req = urllib.request.Request(self.base + "/metrics")
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read().decode()

    def metric(self, sample):
        for line in self.metrics().splitlines():
            if line.startswith(sample + " "):
                return float(line.rsplit(" ", 1)[1])
        return None

    def wait(self, cond, timeout, what):
        deadline = time.monotonic() + self.clock.bound(timeout)
        while not cond():
            if self.proc.poll() is not None:
                raise RuntimeError(f"inferd exited ({self.proc.returncode}) waiting for {what}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.2)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def output(ans):
    outs = ans.get("modelOutputs") or [None]
    return outs[0] if isinstance(outs[0], dict) else {}


def project_entry(pid, dir_, command, env, extra, min_replicas=0):
    env_yaml = ", ".join(f'{k}: "{v}"' for k, v in env.items())
    return (f"  - id: {pid}\n    team: gpucheck\n    modelKey: mk-{pid}\n    command: {json.dumps(command)}\n"
            f"    dir: {dir_}\n    env: {{{env_yaml}}}\n    protocol: http\n    bootTimeout: 170\n"
            f"    inferenceTimeout: 170\n    minReplicas: {min_replicas}\n    maxReplicas: 1\n{extra}")


# --- an image (item 6) ------------------------------------------------------

IMAGE_PROBE = r'''import ctypes, glob, http.server, json, os
def probe():
    out = {"nodes": sorted(glob.glob("/dev/nvidia*")), "etcPasswd": os.path.exists("/etc/passwd"), "uid": os.getuid()}
    lib = "/usr/local/nvidia/lib64"
    out["libs"] = sorted(os.listdir(lib)) if os.path.isdir(lib) else []
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        out["cuInit"] = cuda.cuInit(0)
        n = ctypes.c_int(0)
        cuda.cuDeviceGetCount(ctypes.byref(n))
        out["devices"] = n.value
    except OSError as e:
        out["cudaError"] = str(e)
    return out
class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self.answer({"ok": True})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.answer(probe())
http.server.ThreadingHTTPServer((os.environ["HOST"], int(os.environ["PORT"])), Handler).serve_forever()
'''


def python_image(work):
    """Writes an OCI archive (skopeo's oci-archive:) whose root holds this
    python (its program, the libraries ldd names, its standard library) and
    a probe server, and returns its path: a GPU model in an image that
    brings no CUDA of its own, only what inferd binds in from the driver."""
    import sysconfig
    import tarfile
    os.makedirs(work, exist_ok=True)
    exe = os.path.realpath(sys.executable)
    stdlib = sysconfig.get_paths()["stdlib"]
    files = {exe}
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = [d for d in dirs if d not in ("site-packages", "dist-packages", "test", "tests", "idlelib", "tkinter", "__pycache__")]
        files.update(os.path.join(root, n) for n in names)
    needs = [exe] + [f for f in files if f.endswith(".so")]
    for f in needs:
        _, out, _ = run(["ldd", f])
        for m in re.finditer(r"(/\S+) \(0x", out):
            files.add(m.group(1))
    layer = os.path.join(work, "layer.tar")
    with tarfile.open(layer, "w") as tar:
        for f in sorted(files):
            if os.path.isfile(f):
                tar.add(os.path.realpath(f), arcname=f.lstrip("/"), recursive=False)
        probe = IMAGE_PROBE.encode()
        info = tarfile.TarInfo("srv/probe.py")
        info.size, info.mode = len(probe), 0o644
        import io
        tar.addfile(info, io.BytesIO(probe))
    layout = os.path.join(work, "layout")
    os.makedirs(os.path.join(layout, "blobs", "sha256"), exist_ok=True)

    def blob(data=None, path=None):
        import hashlib
        h = hashlib.sha256()
        if path:
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            size = os.path.getsize(path)
            shutil.copyfile(path, os.path.join(layout, "blobs", "sha256", h.hexdigest()))
        else:
            h.update(data)
            size = len(data)
            with open(os.path.join(layout, "blobs", "sha256", h.hexdigest()), "wb") as f:
                f.write(data)
        return "sha256:" + h.hexdigest(), size

    diff, lsize = blob(path=layer)
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    config = json.dumps({"architecture": arch, "os": "linux",
                         "config": {"Entrypoint": [exe, "/srv/probe.py"], "Env": ["PATH=/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE=1"]},
                         "rootfs": {"type": "layers", "diff_ids": [diff]}}).encode()
    cdigest, csize = blob(config)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cdigest, "size": csize},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": diff, "size": lsize}]}).encode()
    mdigest, msize = blob(manifest)
    with open(os.path.join(layout, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mdigest, "size": msize,
                                                      "platform": {"architecture": arch, "os": "linux"}}]}, f)
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        f.write('{"imageLayoutVersion": "1.0.0"}')
    archive = os.path.join(work, "python-probe.tar")
    with tarfile.open(archive, "w") as tar:
        for name in ("oci-layout", "index.json", "blobs"):
            tar.add(os.path.join(layout, name), arcname=name)
    os.chmod(archive, 0o644)
    return archive


# --- the check ------------------------------------------------------------


class GPUCheck:
    def __init__(self, args):
        self.args, self.dry = args, args.dry_run
        self.clock = Clock(args.budget)
        self.report = Report(self.dry)
        self.work = tempfile.mkdtemp(prefix="inferd-gpucheck-")
        os.chmod(self.work, 0o755)  # model users must reach the examples in it
        self.d = None
        self.foreign = None
        self.python = args.python
        self.gpu = None  # the GPU the checks use: nvidia-smi's first, or the simulated one

    # preflight: fail fast, before anything starts
    def preflight(self):
        r, a = self.report, self.args
        if not os.path.isfile(a.inferd) or not os.access(a.inferd, os.X_OK):
            raise SystemExit(f"gpu-check: no inferd binary at {a.inferd}: build one (make gpu-check-bin) and pass --inferd")
        code, out, err = run([a.inferd, "version"])
        if code != 0:
            raise SystemExit(f"gpu-check: {a.inferd} does not run here ({err.strip()}); built on another glibc? "
                             "It needs glibc 2.34 or later (make gpu-check-bin builds it)")
        r.fact("inferd", out.strip())
        code, out, err = run([self.python, "-c", "import sys; print(sys.executable)"])
        if code != 0:
            raise SystemExit(f"gpu-check: python {self.python} does not run: {err.strip()}")
        self.python = out.strip()
        # Touching CUDA here, as root, also loads nvidia_uvm (through the
        # driver's setuid nvidia-modprobe), which a sandboxed replica (no new
        # privileges) could not do for itself.
        code, out, _ = run([self.python, "-c", "import torch; ok = torch.cuda.is_available(); ok and torch.zeros(1, device='cuda'); "
                            "print(torch.__version__, torch.version.cuda, ok, torch.cuda.device_count())"], timeout=180)
        self.torch = out.split() if code == 0 else None
        r.fact("python", f"{self.python}, torch {' '.join(self.torch[:2]) if self.torch else 'none'}")
        self.sklearn = run([self.python, "-c", "import sklearn"], timeout=120)[0] == 0
        r.fact("kernel", platform.release())
        if self.dry:
            r.fact("GPUs", "simulated (gpu.simulate): 1 x Sim A, 16384 MiB")
            self.gpu = {"index": 0, "uuid": "GPU-sim-0000-0000-0000-000000000000", "name": "Sim A", "totalMiB": 16384}
            return
        if os.geteuid() != 0:
            raise SystemExit("gpu-check: run it as root: the replica sandbox (uids, cgroups, device rules) needs it")
        try:
            gpus = smi_gpus()
        except RuntimeError as e:
            raise SystemExit(f"gpu-check: {e}")
        if not gpus:
            raise SystemExit("gpu-check: nvidia-smi lists no GPU")
        if not self.torch or self.torch[2] != "True":
            raise SystemExit(f"gpu-check: {self.python} has no CUDA-enabled torch that sees a GPU ({' '.join(self.torch or ['no torch'])}): "
                             "pass --python PATH")
        if not os.path.exists("/dev/nvidia-uvm"):
            raise SystemExit("gpu-check: /dev/nvidia-uvm is missing though CUDA ran: load nvidia_uvm (modprobe nvidia_uvm) and run again")
        self.gpu = gpus[0]
        r.fact("device", "; ".join(f"GPU {g['index']}: {g['name']} ({g['uuid']}, {g['totalMiB']} MiB, MIG {g['mig']})" for g in gpus))
        r.fact("driver", gpus[0]["driver"])
        code, out, _ = run(["nvidia-smi"])
        m = re.search(r"CUDA Version:\s*([0-9.]+)", out)
        r.fact("CUDA (driver)", m.group(1) if m else "unknown")

    def model_user(self):
        """replica.user: per-project uids when the model's python and the
        examples are usable by another user, else root (then item 3 says the
        uid was not shown)."""
        if os.geteuid() != 0:
            return ""  # inferd cannot switch users: models run as this user
        code, _, _ = run([self.python, "-c", "import torch" if self.torch else "import json"], timeout=120,
                         user=65534, group=65534, cwd="/")
        if code == 0:
            return ""
        return "  user: root\n"

    def examples(self):
        dst = os.path.join(self.work, "examples")
        for name in ("gpuprobe", "digits"):
            shutil.copytree(os.path.join(REPO, "examples", name), os.path.join(dst, name))
        for root, dirs, files in os.walk(self.work):
            for x in dirs:
                os.chmod(os.path.join(root, x), 0o755)
            for x in files:
                os.chmod(os.path.join(root, x), 0o644)
        return dst

    def start_daemon(self):
        user = self.model_user()
        self.root_models = bool(user)
        env = dict(os.environ)
        gpu_cfg = "gpu:\n  refreshInterval: 1s\n"
        if self.dry:
            gpu_cfg += "  simulate:\n    - {name: Sim A, memoryMiB: 16384}\n"
            env["INFERD_FAKE_CHECKPOINT"] = "ok"  # read only by a -tags failpoints build
        extra = gpu_cfg + "replica:\n  stopGrace: 3s\n  restartBackoff: 500ms\n" + user
        self.d = Daemon(self.args.inferd, self.work, self.clock, extra, env)
        self.ex = self.examples()

    def probe_entry(self, pid, extra, alloc=0, env=None, min_replicas=0):
        e = {"PROBE_PYTHON": self.python, "ALLOC_MIB": str(alloc)}
        e.update(env or {})
        return project_entry(pid, os.path.join(self.ex, "gpuprobe"), ["/bin/sh", "-c", 'exec "$PROBE_PYTHON" server.py'], e, extra,
                             min_replicas)

    def digits_entry(self, pid, extra):
        return project_entry(pid, os.path.join(self.ex, "digits"), ["/bin/sh", "-c", 'exec "$DIGITS_PYTHON" server.py'],
                             {"DIGITS_PYTHON": self.python}, extra)

    def replica(self, project):
        reps = self.d.replicas(project)
        return reps[0] if reps else None

    # 1 ---------------------------------------------------------------------
    def discovery(self):
        it = self.report.items[1]
        out = self.d.cli("doctor", check=False)
        lines = [ln for ln in out.splitlines() if re.match(r"^(ok|warn|fail)\s+(gpu|parking|devices|cuda)\b", ln)]
        it.note("`inferd doctor` (GPU lines):\n\n```\n" + "\n".join(lines) + "\n```")
        mine = {g["uuid"]: g for g in self.d.gpus()}
        if self.dry:
            g = mine.get(self.gpu["uuid"])
            it.ok(g is not None and g["memoryTotalBytes"] == self.gpu["totalMiB"] << 20,
                  f"/v1/status/gpus lists the simulated GPU {self.gpu['uuid']} with {self.gpu['totalMiB']} MiB", f"got {list(mine)}")
            it.check(SKIP, "nvidia-smi comparison: no driver in a dry run")
            return
        it.ok(any(re.match(r"^ok\s+gpu\s", ln) for ln in lines), "inferd doctor finds the GPUs", "; ".join(lines) or out[-300:])
        rows = []
        for g in smi_gpus():
            m = mine.get(g["uuid"])
            rows.append([g["index"], g["uuid"], g["totalMiB"], g["mig"],
                         f"{m['memoryTotalBytes'] >> 20} MiB, mig {m['mig']}, healthy {m['healthy']}" if m else "missing"])
            if g["mig"] == "Enabled":
                it.check(PASS if any(x.get("parent") == g["uuid"] for x in mine.values()) else FAIL,
                         f"GPU {g['uuid']} is in MIG mode: inferd lists its MIG devices")
                continue
            it.ok(m is not None and m["memoryTotalBytes"] >> 20 == g["totalMiB"] and m["healthy"] and not m["mig"],
                  f"GPU {g['index']} {g['uuid']}: inferd's UUID, memory ({g['totalMiB']} MiB) and MIG mode match nvidia-smi",
                  f"inferd says {m}")
        it.note(table(["index", "uuid (nvidia-smi)", "MiB (nvidia-smi)", "MIG", "inferd /v1/status/gpus"], rows))

    # 2 ---------------------------------------------------------------------
    def digits(self):
        it = self.report.items[2]
        if self.dry:
            it.check(SKIP, "digits on CUDA needs a real GPU and a CUDA torch")
            return
        image = [0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0, 0, 3, 15, 2, 0, 11, 8, 0, 0, 4, 12, 0, 0, 8, 8, 0,
                 0, 5, 8, 0, 0, 9, 8, 0, 0, 4, 11, 0, 1, 12, 7, 0, 0, 2, 14, 5, 10, 12, 0, 0, 0, 0, 6, 13, 10, 0, 0, 0]
        if self.sklearn:
            model = "digits"
            entry = self.digits_entry
            first = {"pixels": image}
            loads = [("one image (median of 20)", {"pixels": image}, 20), ("1024 images (median of 5)", {"images": [image] * 1024}, 5)]
        else:
            # The figures still come, from the CUDA example: the check of
            # digits itself is what is missing.
            it.check(SKIP, f"{self.python} has no scikit-learn, so examples/digits cannot train: "
                           "the side-by-side below is examples/gpuprobe's matmul instead (pip install scikit-learn, or --python)")
            model = "gpuprobe"
            entry = self.probe_entry
            first = {"matmul": 256, "seconds": 0.05}
            loads = [("matmul 1024x1024 for 0.2 s (median of 5)", {"matmul": 1024, "seconds": 0.2}, 5)]
        gpu_p, cpu_p = f"{model}-gpu", f"{model}-cpu"
        self.d.apply("projects:\n" + entry(gpu_p, "    gpus: 1\n    idleTimeout: 600\n") + entry(cpu_p, "    gpus: 0\n    idleTimeout: 600\n"))
        figures = {}
        for project in (gpu_p, cpu_p):
            ans, wall = self.d.call(f"mk-{project}", first)
            out = output(ans)
            f = figures[project] = {"coldBootS": round(wall, 2), "device": out.get("device"), "digit": out.get("digit"), "runMs": {}}
            for name, inputs, n in loads:
                runs = [self.d.call(f"mk-{project}", inputs)[0] for _ in range(n)]
                f["runMs"][name] = statistics.median(r.get("runMs", 0) for r in runs)
                if "tflops" in output(runs[-1]):
                    f["tflops"] = output(runs[-1])["tflops"]
        g, c = figures[gpu_p], figures[cpu_p]
        it.ok(g["device"] == "cuda", f"{gpu_p} answers from device cuda", f"it says {g['device']!r} (see its log: inferd logs {gpu_p})")
        if model == "digits":
            it.ok(g["digit"] == 0 and c["digit"] == 0, "both classify the sample image (a 0) alike", f"gpu {g['digit']}, cpu {c['digit']}")
        rep = self.replica(gpu_p)
        apps = smi_apps()
        uuid_of = {x["index"]: x["uuid"] for x in self.d.gpus()}
        pinned = [uuid_of.get(i) for i in rep["gpus"]] if rep else []
        mine = [pid for pid in group_pids(rep["pid"]) if pid in apps] if rep else []
        it.ok(bool(mine) and all(apps[pid][0] in pinned for pid in mine),
              f"the replica's process {mine} (host pids; its init is {rep and rep['pid']}) is in nvidia-smi --query-compute-apps on its pinned GPU {pinned}",
              f"nvidia-smi lists {apps}")
        rows = [["cold boot to first answer (s)", g["coldBootS"], c["coldBootS"]]]
        rows += [[f"run time, {name} (ms)", g["runMs"][name], c["runMs"][name]] for name, _, _ in loads]
        if "tflops" in g:
            rows.append(["TFLOPS (float32)", g["tflops"], c.get("tflops")])
        it.note(table([model, "GPU (cuda)", "CPU (same box)"], rows) +
                "\n\nrun time is the call's `runMs`: dispatch to answer, HTTP to the model and JSON included.")
        self.report.data[model] = figures
        self.d.delete(gpu_p)
        self.d.delete(cpu_p)

    # 3 ---------------------------------------------------------------------
    def containment(self):
        it = self.report.items[3]
        self.d.apply("projects:\n" + self.probe_entry("probe-gpu", "    gpus: 1\n    idleTimeout: 600\n") +
                     self.probe_entry("probe-cpu", "    gpus: 0\n    idleTimeout: 600\n"))
        prot = {p["name"]: p for p in self.d.status().get("protections", [])}
        for name in ("identity", "devices", "network"):
            p = prot.get(name)
            if self.dry and not (p and p["on"]):
                it.check(SKIP, f"protection {name} is off on this box: {p and p['detail']}")
                continue
            it.ok(p is not None and p["on"], f"protection {name} on: {p and p['detail']}", "it is off")
        gpu_probe = output(self.d.call("mk-probe-gpu", {})[0])
        rep = self.replica("probe-gpu")
        model = model_pid(rep["pid"]) if rep else None
        uid = proc_status(model, "Uid") if model else None
        if self.root_models:
            it.check(FAIL if not self.dry else SKIP, f"models run as root here: {self.python} is not usable by another user, so the per-project uid was not shown")
        else:
            it.ok(uid is not None and uid[0] != "0", f"the GPU replica's model runs as uid {uid and uid[0]}, not root")
        try:
            own_net = os.readlink("/proc/self/ns/net")
            rep_net = os.readlink(f"/proc/{model}/ns/net")
            if self.dry and own_net == rep_net:
                it.check(SKIP, "the replica shares the host's network on this box")
            else:
                it.ok(own_net != rep_net, f"the GPU replica has a network namespace of its own ({rep_net})")
        except (OSError, TypeError) as e:
            it.check(SKIP if self.dry else FAIL, f"cannot read the replica's network namespace: {e}")
        nodes = gpu_probe.get("nodes", {})
        self.report.data["probe-gpu"] = gpu_probe
        if self.dry:
            it.check(SKIP, f"CUDA init in the sandbox: no driver (the replica saw CUDA_VISIBLE_DEVICES={gpu_probe.get('cudaVisibleDevices')})")
        else:
            work = output(self.d.call("mk-probe-gpu", {"matmul": 2048, "seconds": 0.5})[0])
            it.ok(work.get("device") == "cuda", "CUDA initialises inside the GPU replica's sandbox (a matmul ran on cuda)", f"it answered {work}")
            it.ok(gpu_probe.get("torchDevices") == 1, "torch in the replica sees exactly its one pinned GPU", f"torchDevices {gpu_probe.get('torchDevices')}")
            it.ok(gpu_probe.get("torchDevicesUnset") == 1,
                  "with CUDA_VISIBLE_DEVICES unset it still sees one GPU (the device rules; on a one-GPU box this shows little)",
                  f"torchDevicesUnset {gpu_probe.get('torchDevicesUnset')}")
            opened = sorted(k for k, v in nodes.items() if v == "ok")
            want = {"/dev/nvidiactl", "/dev/nvidia-uvm", f"/dev/nvidia{self.gpu_minor()}"}
            it.ok(want <= set(opened), f"the GPU replica opens {sorted(want)}", f"it opened {opened}; all: {nodes}")
            others = [k for k, v in nodes.items() if v == "ok" and k not in want and k != "/dev/nvidia-uvm-tools"]
            it.ok(not others, "and no other NVIDIA node", f"it also opened {others}")
        cpu_probe = output(self.d.call("mk-probe-cpu", {})[0])
        self.report.data["probe-cpu"] = cpu_probe
        cpu_nodes = cpu_probe.get("nodes", {})
        if not cpu_nodes:
            it.check(SKIP if self.dry else FAIL, "a CPU replica opens no /dev/nvidia* node: there are none on this box")
        else:
            opened = [k for k, v in cpu_nodes.items() if v == "ok"]
            it.ok(not opened, f"a CPU replica opens none of the {len(cpu_nodes)} NVIDIA nodes", f"it opened {opened}")
        if not self.dry:
            it.ok(cpu_probe.get("torchDevicesUnset") == 0, "a CPU replica's torch sees no GPU even with CUDA_VISIBLE_DEVICES unset",
                  f"it sees {cpu_probe.get('torchDevicesUnset')}")
        it.note("GPU replica's probe: `" + json.dumps({k: gpu_probe.get(k) for k in ("cudaVisibleDevices", "torch", "torchDevices", "torchDevicesUnset", "nodes")}) +
                "`\n\nCPU replica's probe: `" + json.dumps({k: cpu_probe.get(k) for k in ("cudaVisibleDevices", "torchDevicesUnset", "nodes")}) + "`")
        self.d.delete("probe-cpu")

    def gpu_minor(self):
        code, out, _ = run(["nvidia-smi", "-i", str(self.gpu["index"]), "-q"])
        m = re.search(r"Minor Number\s*:\s*(\d+)", out)
        return m.group(1) if m else str(self.gpu["index"])

    def sharing(self):
        it = self.report.items[3]
        if self.dry:
            it.check(SKIP, "shares placed by the driver's free memory: simulated GPUs have no driver")
            return
        free0 = smi_gpus()[0]["freeMiB"]
        foreign_mib, a, b = int(free0 * 0.30), int(free0 * 0.35), int(free0 * 0.45)
        self.foreign = subprocess.Popen(
            [self.python, "-c", "import sys, torch, time; x = torch.empty(int(sys.argv[1]) << 20, dtype=torch.uint8, device='cuda'); "
             "x.fill_(1); torch.cuda.synchronize(); print('holding', flush=True); time.sleep(3600)", str(foreign_mib)],
            stdout=subprocess.PIPE, text=True, env=dict(os.environ, CUDA_VISIBLE_DEVICES=self.gpu["uuid"]))
        ready, _, _ = select.select([self.foreign.stdout], [], [], self.clock.bound(120))
        if not ready or self.foreign.stdout.readline().strip() != "holding":
            it.check(FAIL, "the outside process could not allocate its GPU memory (its error is on stderr above)")
            return
        self.d.wait(lambda: self.foreign.pid in smi_apps(), 30, "nvidia-smi to list the outside process")
        it.note(f"Shares: free {free0} MiB at first; a python3 outside inferd holds {foreign_mib} MiB; share-a declares {a} MiB "
                f"(and allocates {a - 1024}; a minimum, so that it is not evicted for b), share-b {b} MiB: b fits only once the "
                "outside process is gone.")
        self.d.apply("projects:\n" + self.probe_entry("share-a", f"    gpuMemoryMiB: {a}\n    idleTimeout: 600\n", alloc=a - 1024, min_replicas=1) +
                     self.probe_entry("share-b", f"    gpuMemoryMiB: {b}\n    idleTimeout: 600\n"))
        self.d.call("mk-share-a", {"touch": True})
        pid_a = self.replica("share-a")["pid"]
        ans, _ = self.d.call("mk-share-b", {"touch": True}, start_only=True)
        time.sleep(8)  # several GPU polls (1 s) and driver reads: b must still wait
        waiting = (self.d.project("share-b") or {}).get("waiting", "")
        state = self.d.check(ans["callID"]).get("message")
        it.ok(state == "queued" and "waiting for GPU" in waiting,
              f"share-b ({b} MiB) waits while the outside process holds {foreign_mib} MiB: {waiting!r}", f"call is {state!r}, waiting {waiting!r}")
        self.foreign.kill()
        self.foreign.wait()
        self.foreign = None
        res = self.d.wait_call(ans["callID"], 120)
        it.ok(res.get("message") == "success", "once it exits, share-b boots beside share-a on the same GPU", res.get("message"))
        rb = self.replica("share-b")
        ra = self.replica("share-a")
        it.ok(ra is not None and ra["pid"] == pid_a and rb is not None and rb["gpus"] == ra["gpus"],
              "share-a kept running, and both hold the same GPU", f"a {ra}, b {rb}")
        self.d.delete("share-a")
        self.d.delete("share-b")

    # 4 ---------------------------------------------------------------------
    def energy(self):
        it = self.report.items[4]
        if self.dry:
            it.check(SKIP, "the energy counter needs a real GPU")
            self.d.delete("probe-gpu")
            return
        if not self.replica("probe-gpu"):  # item 3 stopped before it ran
            self.d.apply("projects:\n" + self.probe_entry("probe-gpu", "    gpus: 1\n    idleTimeout: 600\n"))
        try:
            nvml = NVML()
        except (OSError, RuntimeError) as e:
            it.check(FAIL, f"libnvidia-ml.so.1 unusable from python: {e}")
            return
        uuid = self.gpu["uuid"]
        if nvml.energy_mj(uuid) is None:
            it.check(SKIP, f"the driver reports no total-energy counter for {uuid} (nvmlDeviceGetTotalEnergyConsumption)")
            return
        rows, joules = [], []
        self.d.call("mk-probe-gpu", {"matmul": 4096, "seconds": 0.2})  # warm: cuBLAS loaded
        ledger0 = self.ledger_energy("probe-gpu")
        for n in range(5):
            before = nvml.energy_mj(uuid)
            ans, wall = self.d.call("mk-probe-gpu", {"matmul": 4096, "seconds": 1.0})
            after = nvml.energy_mj(uuid)
            j = (after - before) / 1000
            joules.append(j)
            rows.append([n + 1, ans.get("runMs"), f"{j:.1f}", f"{j / wall:.0f}"])
        ledger1 = self.ledger_energy("probe-gpu")
        it.ok(all(j > 0 for j in joules), f"the counter rises over every call: {', '.join(f'{j:.1f}' for j in joules)} J")
        note = "\n\nEach call multiplies 4096x4096 float32 matrices for about 1 s on the replica's GPU; the counter is read around each HTTP call."
        if ledger0 is not None and ledger1 is not None:
            note += f" inferd's usage ledger (/v1/usage) charged the five calls {ledger1 - ledger0:.1f} J, the counter {sum(joules):.1f} J."
            it.ok(ledger1 > ledger0, f"inferd's usage ledger counts the calls' energy: {ledger1 - ledger0:.1f} J for the five")
        else:
            note += " This inferd keeps no energy in a usage ledger (/v1/usage): only the counter was read."
        it.note(table(["call", "runMs", "joules", "watts"], rows) + note)
        self.report.data["energyJoules"] = joules
        self.d.delete("probe-gpu")

    def ledger_energy(self, project):
        """The energy inferd's usage ledger (issue #32; GET /v1/usage) has
        charged project today, or None where this inferd keeps none."""
        rep = self.d.http("GET", "/v1/usage?groupBy=project")
        if not isinstance(rep, dict) or "results" not in rep:
            return None
        for line in rep["results"]:
            if line.get("projectId") == project:
                return line.get("energyJoules")
        return 0.0

    # 5 ---------------------------------------------------------------------
    def parking(self):
        it = self.report.items[5]
        alloc = 0 if self.dry else min(8192, self.gpu["totalMiB"] // 4)
        park_after = 1 if self.dry else 3
        spec = f"    gpus: 1\n    idleTimeout: 600\n    parkTimeout: {park_after}\n"
        out = self.d.apply("projects:\n" + self.probe_entry("park", spec, alloc=alloc) +
                           self.probe_entry("whole", "    gpus: 1\n    idleTimeout: 0\n"))
        if "cannot be parked here" in out:
            reason = next(ln for ln in out.splitlines() if "cannot be parked" in ln)
            if self.dry:
                it.check(SKIP, f"this inferd cannot park on simulated GPUs (a -tags failpoints build fakes the driver): {reason}")
            else:
                it.check(FAIL, f"apply says {reason}")
            self.d.delete("park")
            self.d.delete("whole")
            return
        mark = len(self.d.lines())
        ans, cold1 = self.d.call("mk-park", {"touch": True})
        first = output(ans)
        rep = self.replica("park")
        pid, boot = rep["pid"], first.get("bootId")  # the replica's init (host pid), the model's identity
        model = model_pid(pid)
        used_warm = None if self.dry else smi_used(self.gpu["uuid"])
        rss_warm = rss_mib(model)
        line, _ = self.d.wait_log("replica parked; its GPUs are free", 60, "the replica to park", after=mark, project="park")
        took = line.get("took")
        state = (self.replica("park") or {}).get("state")
        it.ok(state == "parked", f"after parkTimeout ({park_after} s) the idle replica is parked; Park took {ms(took)}", f"its state is {state}")
        held = [g for g in self.d.gpus() if g["uuid"] == self.gpu["uuid"] and g["held"]]
        it.ok(not held, "inferd shows its GPU free", f"status: {held}")
        fig = {"allocMiB": alloc, "parkMs": took, "coldFirstAnswerS": round(cold1, 2), "rssWarmMiB": rss_warm}
        if not self.dry:
            time.sleep(2)  # a driver read (gpu.refreshInterval 1 s) after the checkpoint
            used_parked = smi_used(self.gpu["uuid"])
            apps = smi_apps()
            fig.update(usedWarmMiB=used_warm, usedParkedMiB=used_parked, rssParkedMiB=rss_mib(model))
            listed = [x for x in group_pids(pid) if x in apps]
            it.ok(not listed, f"nvidia-smi no longer lists the parked replica's processes (its model: host pid {model})", f"it lists {listed}")
            it.ok(used_warm - used_parked >= alloc * 0.8, f"VRAM freed: {used_warm} -> {used_parked} MiB ({used_warm - used_parked} MiB; it held {alloc} MiB + context)")
        other = output(self.d.call("mk-whole", {"touch": True})[0])
        it.ok(other.get("bootId") not in (None, boot), "another project's whole-GPU replica ran on that GPU while parked", f"it answered {other}")
        self.d.wait(lambda: not self.d.replicas("whole"), 60, "the whole-GPU replica to stop")
        ans, restored = self.d.call("mk-park", {"touch": True})
        back = output(ans)
        rline, _ = self.d.wait_log('"replica restored"', 30, "the restore", after=mark, project="park")
        fig.update(restoreMs=rline.get("took"), restoredFirstAnswerS=round(restored, 2), restoredBootMs=ans.get("bootMs", 0))
        it.ok(back.get("bootId") == boot, f"the next call restored the same process (host pid {model}): first answer after {restored:.3f} s, Restore {ms(rline.get('took'))}",
              f"another process answered (boot {back.get('bootId')}, not {boot}): a cold boot")
        it.ok(back.get("checksum") == first.get("checksum"), f"its GPU memory came back intact (checksum {first.get('checksum')})",
              f"checksum {first.get('checksum')} before, {back.get('checksum')} after")
        # A cold boot of the same model for comparison: a spec change drains
        # the replica, the next call boots afresh.
        self.d.apply("projects:\n" + self.probe_entry("park", spec, alloc=alloc, env={"COLD": "1"}))
        self.d.wait(lambda: all(r["pid"] != pid for r in self.d.replicas("park")), 60, "the old replica to stop")  # pid: the init's
        _, cold2 = self.d.call("mk-park", {"touch": True})
        fig["coldFirstAnswerS2"] = round(cold2, 2)
        cold = min(cold1, cold2)
        if self.dry:
            it.check(SKIP, "VRAM freed, and restore against cold boot: the dry run's checkpointer is a fake")
        else:
            it.ok(restored < cold, f"first answer after restore {restored:.3f} s vs cold boot {cold:.2f} s ({cold / restored:.1f}x)")
        rows = [["model", f"gpuprobe holding {alloc} MiB (ALLOC_MIB)"],
                ["VRAM used warm / parked (MiB, nvidia-smi)", f"{fig.get('usedWarmMiB', '–')} / {fig.get('usedParkedMiB', '–')}"],
                ["replica RSS warm / parked (MiB)", f"{fig.get('rssWarmMiB', '–')} / {fig.get('rssParkedMiB', '–')}"],
                ["time to park (Park)", ms(took)],
                ["time to restore (Restore)", ms(rline.get("took"))],
                ["first answer after restore (s, the call's wall time)", f"{restored:.3f}"],
                ["first answer, cold boot (s): first call / after a spec change", f"{cold1:.2f} / {cold2:.2f}"]]
        it.note(table(["parking", "figure"], rows))
        self.report.data["parking"] = fig
        self.d.delete("park")
        self.d.delete("whole")

    # 6 ---------------------------------------------------------------------
    def image(self):
        it = self.report.items[6]
        archive = python_image(os.path.join(self.work, "image"))
        out = self.d.apply("projects:\n  - id: image-gpu\n    team: gpucheck\n    modelKey: mk-image-gpu\n"
                           f"    image: {archive}\n    gpus: 1\n    bootTimeout: 170\n    inferenceTimeout: 170\n    idleTimeout: 600\n")
        it.ok("project image-gpu: image " in out, "apply imported the image archive", f"apply said {out.strip()}")
        ans, wall = self.d.call("mk-image-gpu", {})
        got = output(ans)
        it.ok(got.get("etcPasswd") is False,
              f"the model answered from its image (first call {wall:.2f} s, booting included), and sees no host /etc/passwd", f"it answered {got}")
        gpu_nodes = [n for n in got.get("nodes", []) if re.fullmatch(r"/dev/nvidia[0-9]+", n)]
        if self.dry:
            it.check(SKIP, f"device nodes and driver libraries need a real driver (the image's /dev has {got.get('nodes')})")
        else:
            it.ok("/dev/nvidiactl" in got.get("nodes", []) and len(gpu_nodes) == 1, f"its /dev has nvidiactl and one GPU node: {got.get('nodes')}")
            it.ok("libcuda.so.1" in got.get("libs", []) and "libnvidia-ml.so.1" in got.get("libs", []),
                  f"the driver's libraries are in /usr/local/nvidia/lib64: {', '.join(got.get('libs', []))}")
            it.ok(got.get("cuInit") == 0 and got.get("devices") == 1,
                  f"cuInit and cuDeviceGetCount from inside the image: {got.get('cuInit')}, {got.get('devices')} device",
                  got.get("cudaError", ""))
        self.d.delete("image-gpu")

    # ---------------------------------------------------------------------
    def run(self):
        print(f"gpu-check: {'dry run on simulated GPUs' if self.dry else 'real GPU'}, budget {self.args.budget}s, work dir {self.work}", flush=True)
        self.preflight()
        self.start_daemon()
        # probe-gpu serves items 3 and 4, then goes: the shares of item 3
        # need the GPU to themselves.
        steps = [(1, self.discovery), (2, self.digits), (3, self.containment), (4, self.energy), (3, self.sharing), (5, self.parking),
                 (6, self.image)]
        for number, step in steps:
            print(f"gpu-check: item {number} ({self.clock.elapsed():.0f}s in)", flush=True)
            try:
                step()
            except OutOfTime as e:
                self.report.items[number].check(FAIL, f"stopped: {e}")
                break
            except Exception as e:  # one item's trouble is its FAIL, the others still run
                self.report.items[number].check(FAIL, f"{type(e).__name__}: {e}")
        self.report.fact("wall time", f"{self.clock.elapsed():.0f} s")

    def cleanup(self):
        if self.foreign is not None:
            self.foreign.kill()
        if self.d is not None:
            self.d.stop()
        out = self.args.out
        if out:
            os.makedirs(out, exist_ok=True)
            if self.d is not None:
                lines = self.d.lines()[-3000:]
                with open(os.path.join(out, "inferd.log"), "w") as f:
                    f.write("\n".join(lines) + "\n")
        if not self.args.keep:
            shutil.rmtree(self.work, ignore_errors=True)


def interrupted(signum, frame):
    """SIGTERM (the device's timeout) ends the run as ^C does: cleanup runs
    and the report says how far it got."""
    raise KeyboardInterrupt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="simulated GPUs; what needs a driver is SKIPPED")
    ap.add_argument("--inferd", default=os.environ.get("INFERD_BIN") or os.path.join(REPO, "bin", "inferd"), help="the inferd binary")
    ap.add_argument("--python", default=os.environ.get("GPU_CHECK_PYTHON") or "python3", help="the models' python (with torch)")
    ap.add_argument("--out", default=os.environ.get("OUT", ""), help="write gpu-report.md, gpu-check.json and inferd.log here")
    ap.add_argument("--budget", type=float, default=480, help="seconds for the whole run (default 480)")
    ap.add_argument("--keep", action="store_true", help="keep the work dir")
    args = ap.parse_args()
    check = GPUCheck(args)
    signal.signal(signal.SIGTERM, interrupted)
    code, stopped = 0, None
    try:
        check.run()
    except SystemExit as e:
        stopped = str(e)
    except KeyboardInterrupt:
        stopped = "gpu-check: interrupted"
    except Exception as e:
        stopped = f"gpu-check: {type(e).__name__}: {e}"
    finally:
        check.cleanup()
    if stopped:
        print(stopped, file=sys.stderr, flush=True)
        check.report.fact("stopped early", stopped)
        code = 2
    md = check.report.markdown()
    path = os.path.join(args.out, "gpu-report.md") if args.out else None
    if path:
        with open(path, "w") as f:
            f.write(md)
        with open(os.path.join(args.out, "gpu-check.json"), "w") as f:
            json.dump({"facts": check.report.facts, "data": check.report.data,
                       "items": {n: {"status": i.status(), "checks": i.checks} for n, i in check.report.items.items()}}, f, indent=1)
    print("\n" + md, flush=True)
    if path:
        print(f"gpu-check: report in {path}", flush=True)
    if code == 0 and check.report.failed():
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    main()
