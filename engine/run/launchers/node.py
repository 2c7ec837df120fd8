"""One machine of several: the built-in trainer under this machine's torchrun agent, the agents
meeting in torchrun's c10d rendezvous (torch.distributed.elastic), not in anything of ours.

    cockpit --no-ui -w W -d D --node NAME --run-id RUN      on every machine, the same RUN
        a node supervisor (engine.run.supervisor with this launcher) in RUN/nodes/NAME
        (engine.record.nodes), over `torchrun --nnodes=MIN:MAX --rdzv-backend=c10d
        --rdzv-endpoint=HOST:PORT --rdzv-id=RUN --max-restarts=0 ...`

What torchrun does and what the node supervisor adds:
- a machine joining a run that trains (a lost one come back): torchrun restarts every agent's
  workers at the larger world (the trainer checkpoints on the SIGTERM and resumes there); the
  supervisor sees the world change in its trainer_ready and says so (`nodes_changed`).
- a machine lost (its host gone, its agent killed): its peers' collectives fail (gloo:
  "Connection reset by peer") or wait for the process group's timeout, 30 minutes by default
  (pytorch#111646). torchrun's own restart would bring the workers back at the same world or
  wait for the lost machine; here the agent runs with --max-restarts=0 and the supervisor judges
  the end: `node-lost` with its evidence, a hang past the hang gap with a silent peer too. Its
  rule (engine.run.fallback) joins the rendezvous again, which re-forms the run at the smaller
  size where nnodes is 'MIN:MAX', from the newest checkpoint (the trainer's own resume), up to
  max_restarts times; a run whose nnodes is a number stops, saying which machine was lost.
  The budget is the supervisor's, not torchrun's per-agent one (pytorch#147064).
- the machine hosting the c10d store (the rendezvous endpoint's) lost takes every agent down
  with it (pytorch#150916): each then judges node-lost and joins again, so the run re-forms
  once a store is back, which that machine's supervisor restarts with its agent.
- `--inject node-lost@N`: this machine's agent and workers killed at once at step N (as a host
  lost), away until the others have trained without it, then back (its rule's retry).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time
from typing import Callable

from engine.emit import Emit
from engine.preset_types import DevicePreset
from engine.record import nodes
from engine.record.events import EventFollower
from engine.run.crashes import Verdict
from engine.run.launch import Launch
from engine.run.launchers.torchrun import TorchrunLauncher, torchrun_argv
from engine.run.launchers.trainer import trainer_launch
from engine.run.process import AttemptProcess
from engine.run.watch import AttemptWatch
from engine.runconfig import RunConfig

# The rendezvous's pace: a round closes 3 s after the fewest machines joined (torchrun's 30 s
# default made a survivor take about 40 s to re-form on loopback, these 3 s); a machine is dead
# after 5 missed heartbeats a second apart (torchrun's: 3, 5 s apart).
RDZV_CONF = "last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=5"
# A machine joining a run that trains never got in with torch 2.13's default: the agent that
# was rank 0 keeps the bootstrap store it made in its first round, so it never writes the next
# round's MASTER_ADDR, and the newcomer waits for it until the store's timeout (DistStoreError).
# Without the shared store every round writes its own (torch's dynamic_rendezvous
# next_rendezvous; found here, on loopback: 1 node + 1 joining 8 s later).
AGENT_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
# How long a rehearsed lost machine stays away at most (its peers re-form in seconds).
AWAY_S = 120.0
# A peer that said it was lost (its agent killed, its supervisor alive to say so) while this
# machine trains nothing: judged lost after this long, not the whole hang timeout, since a
# collective may wait for the process group's timeout instead of breaking (30 minutes).
PEER_LOST_GRACE_S = 30.0
# What a rendezvous that never formed says: the endpoint unreachable, too few machines in time.
_UNFORMED = re.compile(r"RendezvousTimeoutError|RendezvousConnectionError|Connection refused|"
                       r"DistNetworkError|timed out after \d+ms")
# What a peer's loss looks like in a survivor's log: gloo's and NCCL's broken connections, the
# c10d store's, the rendezvous's.
_PEER_LOST = re.compile(r"Connection (?:reset|closed) by peer|Broken pipe|ncclRemoteError|"
                        r"remote process exited or there was a network error|DistNetworkError|"
                        r"RendezvousConnectionError|RendezvousClosedError|connectFullMesh failed")


class NodeLauncher(TorchrunLauncher):
    """engine.train.trainer on this machine, one node of a run on several."""

    name = "node"
    # every machine reports its own loss: a rewind would need all of them to agree to go back
    rewinds = False

    @classmethod
    def fits(cls, config: RunConfig, preset: DevicePreset) -> bool:
        return not config.workload.is_command and preset.nodes[1] > 1

    def __init__(self, run, config):
        super().__init__(run, config)
        # (nodes, world size) its workers train in, and the last step: as its earlier attempts
        # left them, so that the world a re-formed attempt trains in is said to have changed
        self.world: tuple[int, int] | None = None
        self.last_step = 0
        for event in run.events() if run.events_path.exists() else ():
            self.see(event, lambda *a, **k: None)
        self.formed = False                         # its workers started in a world, this attempt
        self.rehearsed = False                      # --inject node-lost fired in this attempt
        self._watch_peers()

    def launch(self, attempt: int, name: str, preset: DevicePreset, resume: dict | None = None) -> Launch:
        run = nodes.run_of(self.run)
        run_id = run.id if run is not None else self.run.id
        launch = trainer_launch(self.run, attempt, name, preset, launcher=node_argv(preset, run_id))
        return dataclasses.replace(launch, env={**AGENT_ENV, **launch.env})

    def run_fields(self) -> dict:
        return {"node": self.run.path.name}

    def describe(self, launch: Launch) -> dict:
        return {"node": self.run.path.name}

    def see(self, event: dict, say: Emit) -> None:
        """Its workers started again in another world (a machine lost, or one come back): said as
        `nodes_changed`, with the steps the restart trained again."""
        kind = event.get("type")
        if kind == "step" or (kind == "attempt_ended" and event.get("last_step") is not None):
            # a restart resumes lower; an attempt's end has the step it reached, exactly
            self.last_step = int(event.get("step", event.get("last_step")) or 0)
        if kind != "trainer_ready" or event.get("world_size") is None:
            return
        world = (int(event.get("nodes") or 1), int(event["world_size"]))
        before, self.world, self.formed = self.world, world, True
        self._watch_peers()   # a world formed: what the others said before it is not of it
        if before is not None and before != world:
            resumed = (event.get("resumed_from") or {}).get("step") or 0
            say("nodes_changed", attempt=int(event.get("attempt") or 0), nodes_before=before[0],
                nodes=world[0], world_size=world[1], resumed_step=resumed,
                steps_lost=max(0, self.last_step - resumed))

    def lose(self, process: AttemptProcess) -> None:
        """`--inject node-lost@N`: the agent and its workers killed at once, as a host lost."""
        self.rehearsed = True
        process.kill()

    def hang_limit(self, launch: Launch, limit: float, quiet_s: float) -> float:
        """Quiet for PEER_LOST_GRACE_S after a peer said it was lost while this machine's world
        trained: judged now (engine.run.attempt), not after the whole `limit`."""
        if not self.formed or quiet_s < PEER_LOST_GRACE_S:
            return limit
        return min(limit, PEER_LOST_GRACE_S) if self._said_lost() is not None else limit

    def away(self) -> Callable[[], bool] | None:
        """After a rehearsed loss, this machine stays away until another trained in a world
        without it (their next trainer_ready), or for AWAY_S at most: the rehearsal shows the run
        going on at the smaller size, then growing back."""
        if not self.rehearsed or self.world is None:
            return None
        fewer, until = self.world[0], time.monotonic() + AWAY_S

        def back() -> bool:
            return time.monotonic() > until or any(
                (seen := nodes.view(n).nodes) is not None and seen < fewer
                for n in nodes.siblings(self.run))
        return back

    def judge(self, watch: AttemptWatch, launch: Launch, code: int | None, tail: str, **facts
              ) -> tuple[Verdict, int | None, str | None]:
        verdict, code, sig = super().judge(watch, launch, code, tail, **facts)
        if not verdict.crashed or facts.get("stop_requested"):
            return verdict, code, sig
        if not self.formed and not self.rehearsed and (
                (line := _first_line(_UNFORMED, tail)) is not None or facts.get("hung_for") is not None):
            return self._unformed(verdict, line or verdict.sentence), code, sig
        if (lost := self._lost(verdict, tail, sig, facts.get("hung_for"))) is not None:
            return lost, code, sig
        return verdict, code, sig

    def _unformed(self, verdict: Verdict, line: str) -> Verdict:
        """The rendezvous never formed a world: the endpoint unreachable, or too few machines
        came before torchrun's join timeout (or the hang gap). Bad input to say, not to retry."""
        endpoint = self.config.device.rdzv_endpoint
        low = self.config.device.nodes[0]
        run = nodes.run_of(self.run)
        return Verdict("config", f"The rendezvous at {endpoint} never formed a world of {low} or more "
                                 f"machines ({line.strip()[:160]}): each machine must reach {endpoint} "
                                 f"and run cockpit --no-ui --node NAME --run-id {run.id if run else '?'} "
                                 "with the same device preset.",
                       {**verdict.evidence, "message": line, "node": self.run.path.name,
                        "judged_by": self.name})

    def _lost(self, verdict: Verdict, tail: str, sig: str | None, hung_for: float | None) -> Verdict | None:
        """A crash that is a machine lost: this one's (its agent killed), or a peer's (a broken
        connection in the log; a hang after it said it was lost, or with it silent), with its
        evidence: `machine`, the one lost, where known."""
        where = f" after step {self.last_step}" if self.last_step else ""
        evidence, machine = {**verdict.evidence}, None
        quiet = verdict.evidence.get("message", "no progress")
        if self.rehearsed:
            machine, how = self.run.path.name, "its agent and workers killed: rehearsed, --inject node-lost"
        elif verdict.kind == "killed" and sig == "SIGKILL":
            machine, how = self.run.path.name, "its torchrun agent was killed by SIGKILL"
        elif (line := _first_line(_PEER_LOST, tail)) is not None:
            # the broken connection and its address, not gloo's advice after it
            found = _PEER_LOST.search(line)
            who, how = self._peer(), line[found.start():].split(". ")[0] if found else line
            evidence["message"] = line
        elif hung_for is not None and (machine := self._said_lost()) is not None:
            how = f"{quiet}, after its supervisor said so"
        elif hung_for is not None and (machine := self._silent_peer(hung_for)) is not None:
            how = f"{quiet}, and it is silent too"
        else:
            return None
        if machine is not None:
            who = f"This machine ({machine})" if machine == self.run.path.name else f"Machine {machine}"
            evidence["machine"] = machine
        evidence["node"] = self.run.path.name
        return Verdict("node-lost", f"{who} was lost{where} ({how}).", evidence)

    def _watch_peers(self) -> None:
        """From now on, what the others' supervisors say: read from where their events end now
        (this machine's reading, not a clock another machine keeps)."""
        self._peers = {n.path.name: EventFollower.from_end(n.events_path) for n in nodes.siblings(self.run)}
        self._peer_said: str | None = None   # a machine said it was lost while this world trained

    def _said_lost(self) -> str | None:
        """A machine of the run whose supervisor said, since this machine's world formed, that
        it was lost (one that joined since: all it said)."""
        for node in nodes.siblings(self.run) if self._peer_said is None else ():
            follower = self._peers.setdefault(node.path.name, EventFollower(node.events_path))
            if any(nodes.lost_itself(e, node.path.name) for e in follower.poll()):
                self._peer_said = node.path.name
                break
        return self._peer_said

    def _peer(self) -> str:
        """Which machine is gone, as far as the run's directories say: the one whose supervisor
        said so while this world trained, or the one silent longest."""
        if (said := self._said_lost()) is not None:
            return f"Machine {said}"
        others = [nodes.view(n) for n in nodes.siblings(self.run)]
        quiet = sorted((v for v in others if v.last_event is not None), key=lambda v: v.last_event or 0)
        return f"A machine ({quiet[0].name}, silent longest)" if quiet else "A machine of the run"

    def _silent_peer(self, quiet_s: float) -> str | None:
        """A machine of the run that has written nothing for as long as this one trained nothing."""
        now = time.time()
        for view in (nodes.view(n) for n in nodes.siblings(self.run)):
            if view.last_event is not None and now - view.last_event >= quiet_s:
                return view.name
        return None


def _first_line(pattern: re.Pattern, text: str) -> str | None:
    return next((line.strip() for line in text.splitlines() if pattern.search(line)), None)


def node_argv(preset: DevicePreset, run_id: str, python: str = sys.executable) -> list[str]:
    """The torchrun command of one machine of several, in front of `-m engine.train.trainer`."""
    low, high = preset.nodes
    return torchrun_argv(preset, python, rendezvous=(
        f"--nnodes={low}:{high}" if low < high else f"--nnodes={high}", "--rdzv-backend=c10d",
        f"--rdzv-endpoint={preset.rdzv_endpoint}", f"--rdzv-id={run_id}", f"--rdzv-conf={RDZV_CONF}"))
