"""Datasheet peaks of the GPUs people train on, for model FLOP utilisation (MFU).

MFU = the model's training FLOPs per second (the workload's flops_per_sample x samples/s) over
the device's dense peak at the precision it computes in. Dense: no 2:4 sparsity, which
training does not use. A device not in the table has no MFU (absent, not a guess); the CPU
and Apple GPUs publish no comparable figure.

Sources: NVIDIA's datasheets (H100, H200, A100, L4, L40S, A10) and the Ada architecture
whitepaper (RTX 4090: tensor FP16/BF16 with FP32 accumulate, which is what torch's bf16
matmuls use), in TFLOP/s.
"""

from __future__ import annotations

import re

# (name fragment, {precision: dense TFLOP/s}); the first fragment in the device's name wins,
# so the more specific comes first ("H100 PCIe" before "H100", "A100" before "A10").
PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    ("H100 PCIe", {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),      # SXM5
    ("H200 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    ("H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),      # SXM
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("A10", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    ("RTX 4090", {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6}),
)


def peak_tflops(device_name: str, precision: str, tf32: bool = False) -> float | None:
    """The dense peak for this GPU name and precision (fp32 matmuls on tensor cores count as
    tf32 when torch allows it), or None when the table does not know the device."""
    key = "tf32" if precision == "fp32" and tf32 else precision
    for fragment, peaks in PEAKS:
        # a whole word: "A10" is not the A10G, nor "L4" the L40
        if re.search(re.escape(fragment) + r"(?![\w])", device_name):
            return peaks.get(key)
    return None


def device_peak(device, precision: str) -> tuple[float, str] | None:
    """(peak TFLOP/s, the GPU's name) for a torch device, or None (not CUDA, or not known)."""
    import torch

    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    tf32 = torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
    peak = peak_tflops(name, precision, tf32)
    return (peak, name) if peak else None
