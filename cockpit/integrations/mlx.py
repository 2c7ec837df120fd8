"""Run an MLX program on the device a cockpit preset names, without changing the program.

    python -m cockpit.integrations.mlx --device {mlx_device} -m mlx_lm lora --model ... --train
    python -m cockpit.integrations.mlx --device cpu train.py --epochs 3

MLX has no environment variable or flag that picks its device: a program runs on the GPU
(Metal on a Mac, CUDA where MLX's CUDA build is installed) unless its own code calls
`mx.set_default_device`. This does that call, then runs the module (`-m NAME`) or the script
as `python` would, with the rest of the arguments as its argv. So a device preset's ladder can
go from the GPU to the CPU ({mlx_device} is "gpu" for a preset on mps or cuda, "cpu" for cpu):
the Mac's unified memory is shared either way, but the CPU is where a Metal failure cannot
happen. `--device gpu` where MLX has no GPU is refused before the program starts (argparse's exit 2).
"""

from __future__ import annotations

import argparse
import runpy
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cockpit.integrations.mlx", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("gpu", "cpu"), required=True, help="MLX's default device")
    parser.add_argument("-m", dest="module", help="run a module, as python -m does")
    parser.add_argument("program", nargs=argparse.REMAINDER, help="the script (unless -m) and its arguments")
    args = parser.parse_args(argv)
    if not args.module and not args.program:
        parser.error("expected -m MODULE or a script to run")
    try:
        import mlx.core as mx
    except ImportError:  # raised, so cockpit reads a missing package, which no fallback fixes
        raise ModuleNotFoundError("MLX is not installed for this python: pip install mlx-lm (Mac) "
                                  "or pip install \"mlx[cpu]\" mlx-lm (Linux)") from None
    device = mx.gpu if args.device == "gpu" else mx.cpu
    if not mx.is_available(device):
        parser.error("argument --device: MLX has no GPU on this machine (no Metal, no CUDA "
                     "build); expected --device cpu")
    mx.set_default_device(device)
    if args.module:
        sys.argv = [args.module, *args.program]
        runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args.program)
        runpy.run_path(args.program[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
