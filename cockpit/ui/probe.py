"""The launch screen's seam for the device probe (`cockpit probe`, not built yet).

The probe writes its last result as JSON to probe_path(); last_probe() reads it back. Until a
probe has run there is no file and the launch screen says so. The probe work fills this in:
change probe_path() or last_probe() here, nothing else in the UI reads probe results.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine import paths

NO_PROBE = "no probe yet — cockpit probe"


def probe_path() -> Path:
    return paths.user_config_dir() / "probe.json"


def last_probe() -> dict | None:
    """The last probe result, or None when there is none (or it cannot be read)."""
    try:
        result = json.loads(probe_path().read_text())
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) else None


def probe_line(result: dict | None) -> str:
    """One line for the launch screen: the probe's own summary, else its scalar fields."""
    if result is None:
        return NO_PROBE
    if isinstance(result.get("summary"), str):
        return "probe: " + result["summary"]
    fields = [f"{k} {v}" for k, v in result.items() if isinstance(v, (str, int, float, bool))]
    return "probe: " + ("  ".join(fields) or "(empty result)")
