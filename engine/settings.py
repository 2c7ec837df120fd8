"""The user's settings.toml (in the user config dir, engine.paths): one table per concern.

    [alerts]
    on = ["crash", "fallback", "finish", "failure", "slowdown", "hang"]
    terminal = "auto"          # bell + OSC 9 (OSC 99 on kitty, 777 on foot, urxvt, VTE); or one of them, "bell", "off"
    desktop = true             # macOS notification centre (osascript), Linux notify-send
    notify_command = "curl -s -d @- ntfy.sh/my-topic"   # the alert as JSON on stdin
    notify_timeout_s = 10.0

A missing file is the defaults. Unknown keys and wrong types are one ConfigError naming the file
and the key. COCKPIT_ALERTS=off silences every alert (CI, test suites); nothing else reads the
environment here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from engine import paths
from engine.errors import ConfigError
from engine.files import read_toml
from engine.schema import FieldError, from_table, setting, unknown_key

ALERT_EVENTS = ("crash", "fallback", "finish", "failure", "slowdown", "hang", "health")
TerminalMode = Literal["auto", "osc9", "osc99", "osc777", "bell", "off"]


@dataclass(frozen=True, kw_only=True, slots=True)
class AlertSettings:
    """[alerts]: which of a run's events tell you, and how."""

    on: tuple[str, ...] = setting(list(ALERT_EVENTS), "events that alert: " + ", ".join(ALERT_EVENTS))
    terminal: TerminalMode = setting("auto", "the terminal cockpit was started from: the bell and "
                                             "a notification escape (auto: OSC 9, OSC 99 for kitty, "
                                             "OSC 777 where TERM says foot, rxvt or VTE); bell only; or off")
    desktop: bool = setting(True, "a notification on this machine's desktop when it has one "
                                  "(osascript on macOS, notify-send on Linux)")
    notify_command: str = setting("", "a shell command run with the alert as JSON on stdin "
                                      "(wire ntfy, Slack or mail yourself); empty: none")
    notify_timeout_s: float = setting(10.0, "a notify command still running after this long is "
                                            "killed and reported", above=0.0, max=600.0)

    def __post_init__(self):
        for name in self.on:
            if name not in ALERT_EVENTS:
                raise FieldError("on", f"got {name!r}, expected a list of " + ", ".join(ALERT_EVENTS))

    @property
    def silent(self) -> bool:
        return not self.on or (self.terminal == "off" and not self.desktop and not self.notify_command)


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    alerts: AlertSettings = field(default_factory=AlertSettings)


TABLES = {"alerts": AlertSettings}


def path() -> Path:
    return paths.user_config_dir() / "settings.toml"


def load() -> Settings:
    """The user's settings, checked (ConfigError naming the file and key), with COCKPIT_ALERTS."""
    where = path()
    settings = Settings()
    if where.exists():
        table = read_toml(where)
        values = {}
        for key, value in table.items():
            if key not in TABLES:
                raise unknown_key(str(where), key, TABLES, elsewhere=(
                    (AlertSettings, "{key} belongs in the [alerts] table"),))
            if not isinstance(value, dict):
                raise ConfigError(str(where), key, f"got {value!r:.40}, expected a table ([{key}])")
            values[key] = from_table(TABLES[key], value, where=str(where), prefix=f"{key}.")
        settings = Settings(**values)
    switch = os.environ.get("COCKPIT_ALERTS", "")
    if switch == "off":
        settings = replace(settings, alerts=replace(settings.alerts, on=()))
    elif switch:
        raise ConfigError("COCKPIT_ALERTS", None, f"got {switch!r}, expected 'off' or unset")
    return settings
