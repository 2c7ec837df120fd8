"""Where cockpit reads and writes, decided in one place.

Tests and users point these elsewhere with environment variables, never by patching
call sites: COCKPIT_CONFIG_DIR (the user's presets), COCKPIT_RUNS_DIR (run directories),
COCKPIT_CACHE_DIR (probe results and torch.compile's caches: deleting it loses nothing but time).
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "cockpit"

# Shipped presets sit beside the packages in a source checkout; in an installed wheel they
# are packaged as engine/_presets (see pyproject.toml), so both layouts are searched.
_SOURCE_PRESETS = Path(__file__).resolve().parent.parent / "presets"
_PACKAGED_PRESETS = Path(__file__).resolve().parent / "_presets"


def shipped_presets_dir() -> Path:
    return _SOURCE_PRESETS if _SOURCE_PRESETS.is_dir() else _PACKAGED_PRESETS


def user_config_dir() -> Path:
    override = os.environ.get("COCKPIT_CONFIG_DIR")
    if override:
        return Path(override).expanduser()
    return platformdirs.user_config_path(APP, appauthor=False)


def user_presets_dir() -> Path:
    return user_config_dir() / "presets"


def runs_dir() -> Path:
    override = os.environ.get("COCKPIT_RUNS_DIR")
    if override:
        return Path(override).expanduser()
    return platformdirs.user_data_path(APP, appauthor=False) / "runs"


def cache_dir() -> Path:
    override = os.environ.get("COCKPIT_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    return platformdirs.user_cache_path(APP, appauthor=False)


def compile_cache_dir() -> Path:
    """torch.compile's on-disk caches, shared by every run and command of this user: what is
    in them is keyed by its content (engine.run.launch.compile_caches says why that is safe)."""
    return cache_dir().resolve() / "compile"
