"""Training-health findings as the dashboard shows them (the `health` events of
engine.run.training_health): a glyph for each kind, the same on the loss plot and at the head of
the attempts panel's line, and that line -- what was found, where, and what was done about it:

    ▲ loss spike at step 1,204 (z 9.1): rewound to 1,100, skipping 300 batches
    ◆ gradient norm explosion at step 300 (z 8.2): warned

A line is never wrapped (a panel at 80x24 is 47 columns wide): it is the first of its wordings
that fits -- the batches skipped dropped, then the evidence and longer words, then a lowered
learning rate's factor, never the step it went back to -- and cut with '…' only where even the
shortest does not.
"""

from __future__ import annotations

import math
from typing import Sequence

from rich.cells import cell_len
from rich.text import Text

from cockpit.ui.model import Attempt

STYLE = "bold yellow"    # a warning's colour; the loss is green and crashes are red
GLYPHS = {"loss-spike": "▲", "grad-explosion": "◆", "divergence": "↗", "plateau": "◇"}
OTHER_GLYPH = "!"        # a kind a newer engine reports
REWIND_GLYPH = "↶"       # on top of the dashed line where an attempt ended to go back
# The kind in words, longest first: a narrow panel takes the shorter.
NAMES = {"loss-spike": ("loss spike",), "grad-explosion": ("gradient norm explosion", "grad norm explosion"),
         "divergence": ("divergence",), "plateau": ("plateau",)}
REWINDS = ("rewind", "lower-lr")    # the actions the supervisor answers by going back


def glyph(kind: str | None) -> str:
    return GLYPHS.get(kind or "", OTHER_GLYPH)


def finding_line(finding: dict, attempt: Attempt | None, width: int) -> Text:
    """The glyph and the finding's line in at most `width` cells; `attempt` is the one it was
    found in, whose fallback says where a rewind went."""
    line = Text(glyph(finding.get("kind")) + " ", style=STYLE)
    room = max(1, width - line.cell_len)
    wordings = _wordings(finding, attempt)
    said = Text(next((w for w in wordings if cell_len(w) <= room), wordings[-1]), style="yellow")
    said.truncate(room, overflow="ellipsis")
    return line + said


def _wordings(finding: dict, attempt: Attempt | None) -> list[str]:
    """Every way to say it, the most said first."""
    rewound = _rewind_fallback(finding, attempt)
    out = []
    if rewound is not None and rewound.get("why"):
        out.append(str(rewound["why"]))   # the supervisor's own line for it (engine.run.rewind)
    whats, dones = _what(finding), _done(finding, attempt, rewound)
    # what was done is dropped last: the evidence and the longer words go before a lr's factor
    for i, done in enumerate(dones):
        for what in whats if i or len(dones) == 1 else whats[:1]:
            out.append(f"{what}: {done}")
    return list(dict.fromkeys(out))


def _what(finding: dict) -> list[str]:
    """'loss spike at step 1,204 (z 9.1)', then without the evidence, then shorter words."""
    kind = finding.get("kind") or "?"
    names = NAMES.get(kind, (kind.replace("-", " "),))
    step = finding.get("step")
    at = f" at step {step:,}" if isinstance(step, int) else ""
    evidence = _evidence(finding)
    out = [str(finding["short"])] if finding.get("short") else []
    out += [f"{names[0]}{at}" + (f" ({evidence})" if evidence else "")]
    out += [f"{name}{at}" for name in names]
    out += [f"{names[-1]} at {step:,}"] if isinstance(step, int) else []
    return list(dict.fromkeys(out))


def _evidence(finding: dict) -> str:
    """'z 9.1' (standard deviations above the window's mean), '12.0x the mean' where the window
    was flat, '' where there was no window (divergence)."""
    z = finding.get("z")
    value, mean, std = (_number(finding.get(k)) for k in ("value", "mean", "std"))
    if z is None and value is not None and mean is not None and std is not None and std > 0:
        z = (value - mean) / std
    if isinstance(z, (int, float)):
        return "z inf" if math.isinf(z) else f"z {z:.1f}"
    if value is not None and mean is not None and std == 0 and mean > 0:
        return f"{value / mean:.1f}x the mean"
    return ""


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _done(finding: dict, attempt: Attempt | None, rewound: dict | None) -> list[str]:
    """What was done, longest first."""
    action = finding.get("action")
    if action == "stop":
        return ["stopped the run", "stopped"]
    if action not in REWINDS:
        return ["warned"]
    if rewound is None:
        if attempt is not None and attempt.failed_why:
            return ["not rewound"]   # no attempt followed: the panel's ✗ line says why
        return ["rewinding" if action == "rewind" else "rewinding, lowering the lr"]
    r = rewound.get("rewind") or {}
    to = r.get("to_step", (rewound.get("resume") or {}).get("step"))
    where = "rewound to the start" if to is None else f"rewound to {to:,}"
    scale = r.get("lr_scale")
    lr = f", lr x{scale:g}" if isinstance(scale, (int, float)) and scale != 1 else ""
    skip = r.get("skip_batches") or 0
    skipping = f", skipping {skip:,} batch{'es' * (skip != 1)}" if skip else ""
    # the lr's factor goes before the step rewound to does: never '1,10…'
    return list(dict.fromkeys([where + skipping + lr, where + lr, where]))


def _rewind_fallback(finding: dict, attempt: Attempt | None) -> dict | None:
    """The fallback that went back for this finding: its attempt's, for a health finding whose
    action was to go back (its `rewind` names the finding's kind and step)."""
    if attempt is None or finding.get("action") not in REWINDS or attempt.fallback is None:
        return None
    f = attempt.fallback
    r = f.get("rewind") or {}
    if f.get("reason") != "health" and not r:
        return None
    step = r.get("step", r.get("spike_step"))
    if r.get("finding", finding.get("kind")) != finding.get("kind") or step not in (None, finding.get("step")):
        return None
    return f


def findings_of(health: list[dict], attempt: Attempt) -> list[dict]:
    """The findings said while `attempt` ran."""
    return [e for e in health if e.get("attempt") == attempt.attempt]


def went_back(attempt: Attempt, findings: Sequence[dict]) -> dict | None:
    """The finding among `findings` that the attempt was ended for, to go back (its crash is
    'health'), where the finding's line says all its fallback did: then that line tells the
    crash and the fallback both."""
    if attempt.crash is None or attempt.crash.get("kind") != "health":
        return None
    finding = next((e for e in reversed(findings) if e.get("action") in REWINDS), None)
    if finding is None or (attempt.fallback is not None and _rewind_fallback(finding, attempt) is None):
        return None
    return finding
