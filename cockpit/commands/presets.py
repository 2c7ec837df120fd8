"""`cockpit presets list`, `cockpit presets show NAME`, `cockpit presets path`: the user's
presets are NAME.toml files in the presets folder's devices/ and workloads/; a .toml file in the
folder itself is read by nothing, so list and path name it."""

from __future__ import annotations

import argparse
import json

from engine import files, paths, presets, settings
from engine.errors import ConfigError
from engine.schema import to_table


def _where(ref: presets.PresetRef) -> str:
    if ref.shipped:
        return "shipped"
    return "user, shadows shipped" if ref.shadows_shipped else "user"


def _read(ref: presets.PresetRef) -> tuple[str, str | None]:
    """(description, error): a preset that cannot be read or checked is listed as broken, with
    the line `presets show` would give, and the rest are still listed."""
    try:
        table = files.read_toml(ref.path)
        presets.check(ref, table)
    except ConfigError as e:
        return "", e.line()
    text = table.get("description", "")
    return (text if isinstance(text, str) else ""), None


def list_(args: argparse.Namespace) -> int:
    found = {kind: [(r, *_read(r)) for r in presets.list_presets(kind)] for kind in presets.KINDS}
    if args.json:
        print(json.dumps({kind: [{"name": r.name, "path": str(r.path), "shipped": r.shipped,
                                  "shadows_shipped": r.shadows_shipped, "description": text,
                                  "error": error} for r, text, error in rows]
                          for kind, rows in found.items()}, indent=2))
        return 0
    for kind, rows in found.items():
        print(kind)
        for r, text, error in rows:
            print(f"  {r.name:<18} {_where(r):<22} " + (f"BROKEN: {error}" if error else text))
    _strays()
    return 0


def show(args: argparse.Namespace) -> int:
    kinds = [args.kind] if args.kind else list(presets.KINDS)
    shown = 0
    for kind in kinds:
        try:
            ref = presets.find(kind, args.name)
        except ConfigError:
            if args.kind:
                raise
            continue
        if kind == "devices":
            preset = presets.load_device(args.name)
            presets.check_ladder(args.name, preset, str(ref.path))
            table = to_table(preset)
        else:
            table = presets.workload_to_table(presets.load_workload(args.name))
        print(f"# {kind[:-1]} preset {ref.name} ({_where(ref)}): {ref.path}")
        print(files.dump_toml(table).decode())
        shown += 1
    if not shown:
        names = "; ".join(f"{kind}: " + ", ".join(r.name for r in presets.list_presets(kind))
                          for kind in presets.KINDS)
        where = presets.misplaced(args.kind, args.name)
        raise ConfigError(f"preset {args.name!r}", None, presets.not_found(where) + f"available {names}")
    return 0


def _strays() -> None:
    for stray in presets.strays():
        print(f"not read: {stray} (a preset goes in devices/ or workloads/ beside it)")


def path(args: argparse.Namespace) -> int:
    user, shipped = paths.user_presets_dir(), paths.shipped_presets_dir()
    print(f"device presets:   {user / 'devices'}/NAME.toml")
    print(f"workload presets: {user / 'workloads'}/NAME.toml")
    print(f"shipped presets:  {shipped / 'devices'}, {shipped / 'workloads'}")
    print(f"runs:             {paths.runs_dir()}")
    print(f"settings:         {settings.path()}")
    _strays()
    return 0
