"""`cockpit probe`: which device trains this workload fastest here, and how big a batch fits.

    cockpit probe -w trm-tiny                         every local device (CPU at 1/physical/logical threads)
    cockpit probe -w trm-tiny --devices cpu,mps       those devices on the base preset (-d, default auto)
    cockpit probe -w trm-tiny --presets mps,mps-safe  whole presets as they are
    cockpit probe -w clip-m1 -d mps --find-batch --save mps-clip

Progress goes to stderr, the table and the recommendation to stdout (--json: the result as
one JSON document). A cached result for the same machine and configuration is shown at once;
--fresh measures again.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time

from engine import presets, runconfig
from engine.errors import ConfigError
from engine.numbers import rate
from engine.probe import FINDER_BUDGET_S, MAX_BATCH, PROBE_BUDGET_S, TRIAL_S, cache, check_budget
from engine.probe import candidates as cands
from engine.probe.batch import check, find_batch, parse_size_mb, preset_table
from engine.probe.speed import FINISH_MARGIN_S, MIN_SLICE_S, ProbeResult, interval_text, probe

COMPILE_EXTRA_S = 120.0  # the default budget's addition per compiled candidate


def add_parser(sub) -> None:
    q = sub.add_parser("probe", help="measure which device trains a workload fastest; "
                                     "--find-batch: the largest micro-batch that fits")
    q.add_argument("--workload", "-w", default=argparse.SUPPRESS, metavar="W",
                   help="workload preset (default: matmul)")
    q.add_argument("--device", "-d", default=argparse.SUPPRESS, metavar="D",
                   help="device preset: the base of --devices, the preset --find-batch sizes (default auto)")
    q.add_argument("--set", action="append", default=argparse.SUPPRESS, metavar="KEY=VALUE",
                   help="override a setting of the workload or of every candidate (repeatable)")
    which = q.add_mutually_exclusive_group()
    which.add_argument("--devices", metavar="LIST", help="devices to compare: cpu,mps,cuda "
                                                          "(default: those this machine has)")
    which.add_argument("--presets", metavar="LIST", help="device presets to compare, as they are")
    q.add_argument("--budget", type=float, metavar="SECONDS",
                   help="wall time for the whole probe (default 60, plus 120 for each compiled "
                        "CUDA candidate; --find-batch 90)")
    q.add_argument("--no-threads", action="store_true",
                   help="measure CPU candidates only at their own thread count")
    q.add_argument("--no-compile", action="store_true",
                   help="measure CUDA candidates only as their presets compile (no twin with "
                        "compile the other way round)")
    q.add_argument("--fresh", action="store_true", help="measure again even if a result is cached")
    q.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="print the result as JSON")
    b = q.add_argument_group("batch finder")
    b.add_argument("--find-batch", action="store_true",
                   help="find the largest micro-batch that fits on -d's device (and keeps "
                        "memory pressure normal and swap flat)")
    b.add_argument("--max-batch", type=int, default=MAX_BATCH, metavar="N",
                   help=f"largest to try ({MAX_BATCH})")
    b.add_argument("--memory-limit", metavar="SIZE",
                   help="also keep the trainer's footprint under this (e.g. 6G, 800M)")
    b.add_argument("--trial-seconds", type=float, default=TRIAL_S, metavar="S",
                   help=f"timed seconds per batch trial ({TRIAL_S:g})")
    b.add_argument("--save", metavar="NAME", help="write the suggestion as a new device preset NAME")
    q.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    workload_name = getattr(args, "workload", "matmul")
    device_name = getattr(args, "device", "auto")
    overrides = list(getattr(args, "set", []) or [])
    as_json = getattr(args, "json", False)
    if args.budget is not None:
        check_budget(args.budget, "--budget")
    config = runconfig.resolve(workload_name, device_name, overrides)
    if args.find_batch:
        if args.devices or args.presets:
            raise ConfigError("--find-batch", None, "sizes one device preset (-d); expected no "
                                                    "--devices/--presets with it")
        return _find_batch(args, config, as_json)
    if args.save or args.memory_limit:
        raise ConfigError("--save" if args.save else "--memory-limit", None,
                          "belongs to the batch finder; expected --find-batch with it")
    candidates = cands.build(config.workload, devices=cands.parse_list(args.devices, "--devices"),
                             preset_names=cands.parse_list(args.presets, "--presets"),
                             base=device_name, overrides=overrides, threads=not args.no_threads,
                             compile=not args.no_compile)
    least = MIN_SLICE_S * len(candidates) + FINISH_MARGIN_S
    if args.budget is not None and args.budget < least:
        raise ConfigError("--budget", None, f"got {args.budget:g}; {len(candidates)} candidates need at "
                                            f"least {least:g} s (or fewer candidates: --no-threads, --devices)")
    return _probe(args, config, candidates, as_json)


# ---------------------------------------------------------------- the speed probe


def _probe(args, config, candidates, as_json: bool) -> int:
    compiled = sum(c.preset.compile for c in candidates)
    # a compile takes minutes on a large model (85 s for trm-chat-small on the H100): without a
    # budget of the user's, each compiled candidate brings its own time for it
    budget = args.budget or PROBE_BUDGET_S + COMPILE_EXTRA_S * compiled
    key = cache.identify(config.workload, candidates, budget)["key"]
    result = None if args.fresh else _cached(key)
    if result is not None:
        _say(f"cached result from {cache.age_text(result.created, time.time())} "
             f"({cache.probes_dir() / (key + '.json')}); --fresh measures again")
    else:
        _say(f"probing {config.workload_preset} on {len(candidates)} candidate(s) within "
             f"{budget:.0f} s: " + ", ".join(c.label for c in candidates))
        # The budget is the user's wait: it counts from this process's start (imports included).
        import psutil

        result = probe(config, candidates, budget, on_progress=_progress,
                       started=psutil.Process().create_time())
        try:
            cache.save(result.to_dict())
        except OSError as e:
            _say(f"cockpit: the result is not cached: {cache.probes_dir()} is not writable ({e.strerror})")
    if as_json:
        print(json.dumps(result.to_dict(), indent=1))
    else:
        print(table(result))
        print(result.sentence)
        if result.recommended:
            chosen = next(c for c in candidates if c.label == result.recommended)
            print("run it:  " + run_command(config, chosen, getattr(args, "device", "auto"),
                                            bool(args.presets)))
    # every candidate too slow to time is an answer: each one's bound, and the budget that settles it
    return 0 if result.answered else 1


def _cached(key: str):
    """The cached result for this key, or None (also for a file this version cannot read)."""
    stored = cache.load(key)
    try:
        result = ProbeResult.from_dict(stored) if stored else None
    except (TypeError, KeyError, ValueError):
        return None
    if result is not None:
        result.cached = True
    return result


def _say(text: str) -> None:
    """Progress goes to stderr, so stdout is only the answer (or its JSON)."""
    print(text, file=sys.stderr, flush=True)


def _progress(update: dict) -> None:
    if update["type"] == "importing":
        _say(f"starting {update['total']} workers (their imports overlap; then one at a time)")
    elif update["type"] == "candidate":
        left = update["until"] - time.time()
        _say(f"[{update['index'] + 1}/{update['total']}] {update['label']}: up to {left:.0f} s")
    elif update["type"] == "result":
        r = update["result"]
        figure = f"{rate(r.samples_per_s)} {r.unit}/s" if r.samples_per_s is not None else ""
        _say(f"      {r.status}" + (f", {figure}" if figure else "") + (f" — {r.note}" if r.note else ""))


def table(result) -> str:
    rows = [("candidate", "device", "batch", "samples/s", "90% interval", "timed", "peak mem", "pressure",
             "swap-in", "parity", "result")]
    for r in result.candidates:
        swap = r.memory.get("swap_in")
        rows.append((
            r.label, r.device or "-", r.batch_text,
            "-" if r.samples_per_s is None else rate(r.samples_per_s),
            interval_text(r.spread), timed_text(r),
            r.peak_text, r.memory.get("pressure") or "n/a",
            "n/a" if swap is None else f"{swap / 2**20:.0f} MB",
            _parity_cell(r),
            (r.status if r.status != "crashed" else f"crashed: {r.crash['kind']}")
            + (f" (compiled in {r.compile_s:.0f} s)" if r.compile_s is not None else ""),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = {3, 4, 5, 6, 8}
    return "\n".join("  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
                     for row in rows)


def timed_text(r) -> str:
    """What the figure stands on: the micro-batches timed after warm-up (a command's: its step
    windows)."""
    timed = r.micro_batches or r.windows
    return f"{timed:,}" if timed else "-"


def _parity_cell(r) -> str:
    """'ok', 'WRONG' or '-' (not checked: the CPU reference itself, a command, no result)."""
    if not r.parity:
        return "-"
    return "ok" if r.parity["ok"] else "WRONG"


def run_command(config, candidate, base: str, presets_mode: bool) -> str:
    """The command that trains with the recommended candidate."""
    words = ["cockpit", "--no-ui", "-w", config.workload_preset]
    if presets_mode:
        words += ["-d", candidate.preset_name]
    else:
        words += ["-d", base, "--set", f"device={candidate.preset.device}"]
    if candidate.preset.device == "cpu" and candidate.preset.threads:
        words += ["--set", f"threads={candidate.preset.threads}"]
    for item in config.overrides:
        words += ["--set", item]
    # compile as measured, where that differs from the preset named above (after the overrides,
    # which may set it): a twin, or a CPU candidate of a compiling base
    if presets_mode:  # the preset as it is, unless the candidate is its twin
        named = not candidate.preset.compile if candidate.twin else candidate.preset.compile
    else:
        named = config.device.compile
    if candidate.preset.compile != named and not config.workload.is_command:
        words += ["--set", f"compile={str(candidate.preset.compile).lower()}"]
    return " ".join(shlex.quote(w) for w in words)


# ---------------------------------------------------------------- the batch finder


def _find_batch(args, config, as_json: bool) -> int:
    if args.max_batch < 1:
        raise ConfigError("--max-batch", None, f"got {args.max_batch}; expected 1 or more")
    if args.trial_seconds <= 0:
        raise ConfigError("--trial-seconds", None, f"got {args.trial_seconds:g}; expected above 0")
    limit = parse_size_mb(args.memory_limit) if args.memory_limit else None
    if args.save:
        presets.check_new_name("devices", args.save)  # before anything is measured
    check(config, config.device, limit)  # a command: it must take {batch_size}
    name = config.device_preset
    _say(f"finding the largest micro-batch for {config.workload_preset} on device preset {name!r} "
         f"(starting at {config.device.batch_size}, up to {args.max_batch})")

    def progress(update: dict) -> None:
        if update["type"] == "trial_done":
            t = update["trial"]
            speed = f", {rate(t.samples_per_s)} samples/s" if t.samples_per_s else ""
            peak = f", {t.footprint_kind} {t.footprint_mb:,.0f} MB" if t.footprint_mb and t.fits else ""
            _say(f"  batch {t.batch:>5}: {'fits' if t.fits else 'no — ' + t.why}{speed}{peak}")

    result = find_batch(config, name, config.device, max_batch=args.max_batch, memory_limit_mb=limit,
                        budget_s=args.budget or FINDER_BUDGET_S, trial_s=args.trial_seconds,
                        on_progress=progress)
    saved = None
    if args.save and result.found is not None:
        saved = presets.save_user_preset("devices", args.save, preset_table(config, result))
    if as_json:
        print(json.dumps({**result.to_dict(), "saved": str(saved) if saved else None}, indent=1))
    else:
        print(result.sentence)
        if saved:
            print(f"saved device preset {args.save!r} to {saved}; run it: cockpit --no-ui "
                  f"-w {config.workload_preset} -d {args.save}")
        elif args.save:
            print("nothing saved: no micro-batch fits, so there is no preset to write")
    return 0 if result.found is not None else 1
