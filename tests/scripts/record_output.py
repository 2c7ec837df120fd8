"""Record a command's output as cockpit's launcher reads it, with when each chunk came:
JSON lines `{"t": seconds since start, "text": chunk}` (stdout and stderr merged, Rich told to
draw its live frames as it does under `cockpit run`). Tests replay the chunks through
OutputParser and Tracker at their recorded times: real output, real timing, no clock.

    python tests/scripts/record_output.py OUT.jsonl -- python SCRIPT ARGS...
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def main() -> int:
    out, argv = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
    # the launcher's (engine.run.launchers.command): Rich draws frames, 200 columns wide
    env = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "COLUMNS": "200", **os.environ,
           "PYTHONUNBUFFERED": "1"}
    start = time.time()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    with open(out, "w") as f:
        while chunk := os.read(child.stdout.fileno(), 65536):
            f.write(json.dumps({"t": round(time.time() - start, 4),
                                "text": chunk.decode("utf-8", "replace")}) + "\n")
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
