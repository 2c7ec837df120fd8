"""The TUI's alerts for the run a dashboard follows: a toast, and the terminal's bell and
notification escape (OSC 9 / 777) written through Textual's driver, so that they never land
inside a frame. The rules are engine.run.alerts' own; the supervisor, detached and without a
terminal, does the desktop notification and the notify command."""

from __future__ import annotations

import time

from textual.app import App
from textual.notifications import SeverityLevel

from engine import settings
from engine.errors import ConfigError
from engine.run.alert_rules import Alert, AlertRules
from engine.run.alerts import escape
from engine.settings import AlertSettings

SEVERITY: dict[str, SeverityLevel] = {"finish": "information", "slowdown": "warning", "fallback": "warning"}


class ScreenAlerts:
    """Alerts from the events a dashboard receives from now on (a replayed past is not news)."""

    def __init__(self, workload: str):
        try:
            self.settings = settings.load().alerts
        except ConfigError:
            self.settings = AlertSettings()  # the supervisor's warning says what is wrong
        self.rules = AlertRules(frozenset(self.settings.on), workload, since=time.time())

    def see(self, events: list[dict]) -> list[Alert]:
        return self.rules.see(events)

    def ring(self, app: App, alert: Alert) -> None:
        app.notify(alert.message, title=alert.title, severity=SEVERITY.get(alert.event, "error"),
                   timeout=15)
        sequence = escape(alert, self.settings.terminal)
        if sequence and not app.is_headless and app._driver is not None:
            app._driver.write(sequence)
