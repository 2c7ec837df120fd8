"""Does the device compute the right numbers? A parity check against the CPU in fp32.

The MPS backend has shipped bugs that give wrong results rather than crashes (backward
gradients wrong by orders of magnitude above 32K elements, BatchNorm backward with
channels_last, SDPA on non-contiguous inputs, addcdiv on non-contiguous tensors): a run on
such a device trains garbage while every monitor is green. So, before training:

1. forward and backward of the run's next micro-batch (its first MAX_SAMPLES samples: the
   CPU's side costs seconds then, not minutes, and activations stay far above the sizes where
   those bugs start), with the run's weights, on the candidate as the run trains it (its
   device, its precision's autocast, its optimizer's kernels) and on a CPU copy in fp32. The
   model runs eagerly even where the run compiles it: a compiled 4-sample graph would cost as
   much as the run's own compile and leave the run's graph dynamic in the batch (torch.compile
   recompiles a size it has seen change); compile's own numerics are not checked. Compared:
   the loss, and each parameter's gradient
   (relative error: the norm of the difference over the norm of the CPU's gradient).
2. one optimizer step on each, both fed the CPU's gradients: the optimizer's kernels are
   compared on equal inputs, so a tight fp32 tolerance holds whatever the precision (step 1
   already judged the precision's error). Compared: each parameter's update.

The worst of each is reported by name, with a verdict against TOLERANCES. The run's model,
optimizer and BatchNorm statistics are put back as they were: the check trains nothing.
Dropout modules are set to p=0 for the check (the two devices' random streams differ); a
model that calls functional dropout itself will not match and should not be checked.

Tolerances, per precision (relative errors; measured in benchmarks/parity.py, whose figures
README gives): fp32 allows float32 rounding and a backend's other summation order, bf16 and
fp16 what autocast's 8 and 11 bits of mantissa cost. The bugs above are errors of 1 and more:
four times the loosest tolerance (bf16's gradient), a hundred times fp32's.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field

import torch

from engine.record.event_types import ParityFields
from engine.train import optim


@dataclass(frozen=True)
class Tolerance:
    loss: float     # |loss - cpu loss| / |cpu loss|
    grad: float     # per parameter: |g - g_cpu| / |g_cpu|
    update: float   # per parameter: |update - cpu update| / |cpu update|, same gradients


# Measured on the H100 against its host's CPU (benchmarks/parity.py, every built-in workload):
# the worst fp32 errors were loss 2.1e-5 and gradient 3.1e-4 (cuDNN's LSTM), bf16's loss 3.5e-3
# and gradient 5.4e-2 (CLIP's LayerNorm bias), every update 4.4e-6 or less. Each tolerance is
# several times the worst seen and still four times below an error of the bugs' size (1 and up).
TOLERANCES = {
    "fp32": Tolerance(loss=1e-3, grad=1e-2, update=1e-3),
    "bf16": Tolerance(loss=3e-2, grad=2.5e-1, update=1e-3),
    "fp16": Tolerance(loss=1e-2, grad=1e-1, update=1e-3),
}
PERTURB_FACTOR = 100.0  # the wrong-grad fault: one gradient wrong by two orders of magnitude
MAX_SAMPLES = 4


@dataclass
class Worst:
    """The parameter with the largest relative error of one kind, and that error."""

    name: str | None = None
    rel: float = 0.0

    def see(self, name: str, rel: float) -> None:
        if rel > self.rel or self.name is None or math.isnan(rel):
            self.name, self.rel = name, rel


@dataclass
class Parity:
    ok: bool
    device: str
    precision: str
    loss: float
    cpu_loss: float
    loss_rel: float
    grad: Worst
    update: Worst
    tolerance: Tolerance
    batch: int
    seconds: float
    problems: list[str] = field(default_factory=list)  # what exceeded its tolerance, in words

    @property
    def verdict(self) -> str:
        return "ok" if self.ok else "numerically wrong"

    def sentence(self) -> str:
        if self.ok:
            return (f"{self.device} in {self.precision} matches the CPU in fp32: loss within "
                    f"{self.loss_rel:.1e}, gradients within {self.grad.rel:.1e} ({self.grad.name}), "
                    f"updates within {self.update.rel:.1e}")
        return f"{self.device} in {self.precision} computes wrong numbers: " + "; ".join(self.problems)

    def event(self) -> ParityFields:
        """The `parity` event's fields."""
        return ParityFields(verdict=self.verdict, ok=self.ok, device=self.device,
                            precision=self.precision, loss=self.loss, cpu_loss=self.cpu_loss,
                            loss_rel=_finite(self.loss_rel),
                            worst_grad={"name": self.grad.name, "rel": _finite(self.grad.rel)},
                            worst_update={"name": self.update.name, "rel": _finite(self.update.rel)},
                            tolerance=asdict(self.tolerance), batch=self.batch,
                            seconds=round(self.seconds, 3), problems=self.problems,
                            message=self.sentence())


class ParityFailure(Exception):
    """The attempt's device failed its parity check (a crash of kind numerical-parity)."""

    def __init__(self, result: Parity):
        self.result = result
        super().__init__(result.sentence())


def check(trainer, *, perturb: bool = False) -> Parity:
    """Compare the trainer's device with the CPU on its next micro-batch (see the module
    docstring). `perturb`: the wrong-grad fault, one gradient made wrong on the candidate."""
    started = time.monotonic()
    cpu = torch.device("cpu")
    model, workload = trainer.model, trainer.workload
    n = min(trainer.preset.batch_size, MAX_SAMPLES, trainer.total_samples - trainer.samples_seen) or \
        min(trainer.preset.batch_size, MAX_SAMPLES)
    position = trainer.samples_seen if trainer.samples_seen < trainer.total_samples else 0
    trainer.maybe_prepare_epoch(trainer.order.epoch_of(position))  # as the next step would
    indices = trainer.order.indices(position, n)

    saved_model = {k: v.detach().clone() for k, v in model.state_dict().items()}
    saved_optimizer = copy.deepcopy(trainer.optimizer.state_dict())
    reference = copy.deepcopy(model).to(cpu).float()
    reference_optimizer = _same_optimizer(trainer, reference)
    dropouts = _silence_dropout(model) + _silence_dropout(reference)
    try:
        trainer.optimizer.zero_grad(set_to_none=True)
        with trainer.resolved.autocast():
            loss = workload.loss(model, workload.batch(indices, trainer.device))
        # fp16 backward as the run does it, scaled so small gradients do not flush to zero
        scale = trainer.scaler.get_scale() if trainer.scaler.is_enabled() else 1.0
        (loss * scale).backward()
        if scale != 1.0:
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.div_(scale)
        cpu_loss = workload.loss(reference, workload.batch(indices, cpu))
        cpu_loss.backward()
        if perturb:
            perturb_gradients(model)

        precision = computed_in(trainer)
        tol = TOLERANCES[precision]
        loss_value, cpu_value = float(loss.detach().float()), float(cpu_loss.detach())
        loss_rel = abs(loss_value - cpu_value) / max(abs(cpu_value), 1e-12)
        grad = Worst()
        mine = dict(model.named_parameters())
        theirs = dict(reference.named_parameters())
        floor = 1e-6 * _global_norm(p.grad for p in theirs.values())  # a zero gradient's scale
        for name, ref in theirs.items():
            got = mine[name].grad
            if ref.grad is None and got is None:
                continue
            if ref.grad is None or got is None:
                grad.see(name, math.inf)
                continue
            grad.see(name, _rel(got.detach().float().to(cpu), ref.grad, floor))

        # The optimizer on equal inputs: the CPU's gradients on both sides.
        before = {name: p.detach().float().to(cpu).clone() for name, p in theirs.items()}
        for name, ref in theirs.items():
            mine[name].grad = None if ref.grad is None else ref.grad.to(mine[name].device, mine[name].dtype)
        _at_peak_lr(trainer.optimizer, trainer.peak_lrs)
        _at_peak_lr(reference_optimizer, trainer.peak_lrs)
        trainer.optimizer.step()
        reference_optimizer.step()
        update = Worst()
        for name, ref in theirs.items():
            expected = ref.detach() - before[name]
            if not expected.any():
                continue  # not updated (frozen, or no gradient): nothing to compare
            got = mine[name].detach().float().to(cpu) - before[name]
            update.see(name, _rel(got, expected, 1e-12))
    finally:
        for module, p in dropouts:
            module.p = p
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.optimizer.load_state_dict(saved_optimizer)
        model.load_state_dict(saved_model)

    problems = []
    if not loss_rel <= tol.loss:
        problems.append(f"loss {loss_value:.6g} against the CPU's {cpu_value:.6g} "
                        f"(relative error {loss_rel:.2g}, tolerance {tol.loss:g})")
    if not grad.rel <= tol.grad:
        problems.append(f"the gradient of {grad.name} is off by {grad.rel:.3g} of its size "
                        f"(tolerance {tol.grad:g})")
    if not update.rel <= tol.update:
        problems.append(f"the optimizer's update of {update.name} is off by {update.rel:.3g} of "
                        f"its size on the same gradients (tolerance {tol.update:g})")
    device = str(trainer.device)
    return Parity(not problems, device, precision, loss_value, cpu_value, loss_rel,
                  grad, update, tol, n, time.monotonic() - started, problems)


def computed_in(trainer) -> str:
    """The precision the forward really computes in: the preset's autocast, or lower where the
    workload's own forward_dtype casts (trm-chat-small computes in bf16 on any preset, and so
    does its CPU copy: the reference is as fp32 as the model lets it be)."""
    own = getattr(trainer.run.config().workload.params, "forward_dtype", "fp32")
    return trainer.resolved.precision if own == "fp32" else own


def _same_optimizer(trainer, reference: torch.nn.Module) -> torch.optim.Optimizer:
    """The optimizer the run uses, built for the CPU copy (its fused CUDA kernel becomes the
    CPU's: the kernels are what is being compared)."""
    own = optim.from_workload(trainer.workload, trainer.name, reference, trainer.train)
    return own[0] if own else optim.build(reference, trainer.train, torch.device("cpu"))


def _at_peak_lr(optimizer: torch.optim.Optimizer, peaks: list[float]) -> None:
    """Both optimizers at the groups' peak rates: a warmup's zero would compare nothing."""
    for group, peak in zip(optimizer.param_groups, peaks):
        group["lr"] = peak


def _silence_dropout(
        model: torch.nn.Module) -> list[tuple[torch.nn.modules.dropout._DropoutNd, float]]:
    silenced = []
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p:
            silenced.append((module, module.p))
            module.p = 0.0
    return silenced


def perturb_gradients(model: torch.nn.Module) -> None:
    """The wrong-grad fault: the largest parameter's gradient, a hundred times too big (the
    MPS bug of pytorch #177116 gave gradients wrong by orders of magnitude above 32K elements).
    The check applies it to the candidate's gradients; the trainer, to every step's once the
    fault has fired, as a buggy backend would."""
    # The largest parameter with a gradient that is not all zeros (a zero one scaled stays right).
    target = max((p for p in model.parameters() if p.grad is not None and bool(p.grad.any())),
                 key=lambda p: p.numel(), default=None)
    if target is not None and target.grad is not None:   # it has one: chosen for it
        target.grad.mul_(PERTURB_FACTOR)


def _global_norm(grads) -> float:
    total = 0.0
    for g in grads:
        if g is not None:
            total += float(g.float().pow(2).sum())
    return math.sqrt(total)


def _rel(got: torch.Tensor, expected: torch.Tensor, floor: float) -> float:
    diff = float((got - expected).float().norm())
    return diff / max(float(expected.float().norm()), floor, 1e-30)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
