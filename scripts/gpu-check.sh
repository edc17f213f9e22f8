#!/bin/sh
# scripts/gpu-check.sh: prove inferd's GPU path on a real GPU box, item by
# item (issue #34; docs/gpu.md "How to verify on a GPU box"), and write the
# result as Markdown for docs/gpu.md.
#
#   sudo OUT=/tmp/out scripts/gpu-check.sh [--inferd bin/inferd] [--python python3] [--budget 480]
#   scripts/gpu-check.sh --dry-run [--inferd PATH]     simulated GPUs, here
#
# It needs root, nvidia-smi, a python3 whose torch sees the GPU (scikit-learn
# too, for examples/digits) and an inferd binary built with cgo for this
# box's glibc (make gpu-check-bin: bin/inferd). No Go, no network. It starts
# its own inferd on a fresh data dir and a free port, and stops it, with
# every model, before it exits. The report goes to $OUT/gpu-report.md (with
# gpu-check.json and the daemon's inferd.log) and to stdout.
#
# Exit status: 0 every item passed or was skipped, 1 an item failed, 2 the
# run could not start (the message says what is missing).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v python3 >/dev/null 2>&1; then
	echo "gpu-check: python3 is needed (with a CUDA torch on a GPU box)" >&2
	exit 2
fi
exec python3 "$here/gpu_check.py" "$@"
