"""The launch screen's probe line and the probe screen's caveats, from the probe cache
(engine.probe.cache); no Textual here.

The line shows the newest probe of the highlighted workload preset, its age, and whether it
was measured with the workload parameters and the micro-batch now selected (a probe of other
settings still says something, but the user should know).
"""

from __future__ import annotations

import time

from engine.probe import cache
from engine.runconfig import RunConfig

NO_PROBE = "no probe yet — p measures which device is fastest here"


def measured_batch(result: dict) -> tuple[int, int] | None:
    """(micro-batch, accumulation) the probe measured at: its recommended candidate's, else
    its first's. None for a probe of a command that takes no batch size (nothing to compare)."""
    candidates = [c for c in result.get("candidates", []) if c.get("batch_size")]
    if not candidates:
        return None
    best = next((c for c in candidates if c.get("label") == result.get("recommended")), candidates[0])
    return best["batch_size"], best.get("accumulation", 1)


def _batches(result: dict, config: RunConfig | None) -> tuple[str, str] | None:
    """The probe's batch and the selected preset's, as words, when they differ (samples/s
    and memory move with the batch): ('64', '32'), or ('32 x 8', '32 x 4') when only the
    accumulation does."""
    measured = measured_batch(result)
    if config is None or measured is None:
        return None
    now = (config.device.batch_size, config.device.accumulation)
    if measured == now:
        return None
    if measured[0] == now[0]:
        return f"{measured[0]} x {measured[1]}", f"{now[0]} x {now[1]}"
    return str(measured[0]), str(now[0])


def batch_note(result: dict, config: RunConfig | None) -> str | None:
    """'measured at batch 64; the preset now has 32', or None when they agree."""
    batches = _batches(result, config)
    return None if batches is None else f"measured at batch {batches[0]}; the preset now has {batches[1]}"


def probe_line(result: dict | None, config: RunConfig | None = None, now: float | None = None) -> str:
    if result is None:
        return NO_PROBE
    age = cache.age_text(result["created"], time.time() if now is None else now)
    stale = (config is not None and result.get("workload_key")
             and result["workload_key"] != cache.workload_key(config.workload))
    caveats = [age] + (["other params"] if stale else [])
    if (batches := _batches(result, config)) is not None:
        caveats.append(f"at batch {batches[0]}, the preset has {batches[1]}")
    return f"probe ({', '.join(caveats)}): {result.get('sentence', '')}"
