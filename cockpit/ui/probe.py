"""The launch screen's probe line, from the probe cache (engine.probe.cache); no Textual here.

The line shows the newest probe of the highlighted workload preset, its age, and whether it
was measured with the workload parameters now selected (a probe of other parameters still
says something, but the user should know).
"""

from __future__ import annotations

import time

from engine.probe import cache
from engine.runconfig import RunConfig

NO_PROBE = "no probe yet — p measures which device is fastest here"


def probe_line(result: dict | None, config: RunConfig | None = None, now: float | None = None) -> str:
    if result is None:
        return NO_PROBE
    age = cache.age_text(result["created"], time.time() if now is None else now)
    stale = (config is not None and result.get("workload_key")
             and result["workload_key"] != cache.workload_key(config.workload))
    other = ", other params" if stale else ""
    return f"probe ({age}{other}): {result.get('sentence', '')}"
