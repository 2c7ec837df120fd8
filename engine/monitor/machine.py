"""What this machine has, read without loading torch: its devices, CPU, memory and GPUs.

Device discovery sits here, on the machine's floor, so that a command's `auto` device, the
probe's candidates and the probe cache's key all ask one place, and none of them imports the
probe to do it. Reading the NVIDIA driver's /proc files never initialises CUDA.
"""

from __future__ import annotations

import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import psutil


def available_devices() -> list[str]:
    """The devices this machine has, fastest kind first, read without loading torch (a cached
    probe answers at once): CUDA where the NVIDIA driver lists a GPU, MPS on Apple Silicon.
    A torch built without that backend makes the candidate `unavailable` in the table, which
    is worth knowing (a CPU-only torch on a GPU machine)."""
    found = []
    if nvidia_gpus():
        found.append("cuda")
    if sys.platform == "darwin" and platform.machine() == "arm64":
        found.append("mps")
    return found + ["cpu"]


def _cpu_model() -> str:
    try:
        if sys.platform == "darwin":
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                  text=True, timeout=5).stdout.strip()
        text = Path("/proc/cpuinfo").read_text()
        match = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
        return match.group(1).strip() if match else platform.processor()
    except (OSError, subprocess.SubprocessError):
        return platform.processor()


def nvidia_gpus() -> list[str]:
    """GPU models from the NVIDIA driver's /proc files (Linux), without initialising CUDA."""
    out = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            match = re.search(r"^Model:\s*(.+)$", info.read_text(), re.M)
        except OSError:
            continue
        if match:
            out.append(match.group(1).strip())
    return out


def machine() -> dict:
    """What a measurement depends on, about the machine."""
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    return {"host": platform.node(), "system": platform.system(), "arch": platform.machine(),
            "cpu": _cpu_model(), "cores": [psutil.cpu_count(logical=False), psutil.cpu_count()],
            "memory_gib": round(psutil.virtual_memory().total / 2**30),
            "gpus": nvidia_gpus(), "torch": torch_version}
