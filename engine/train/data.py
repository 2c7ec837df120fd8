"""The data order, owned by the engine so that resume is exact.

Sample position s (counted from the start of the run) maps to a dataset index through a
per-epoch permutation seeded by (seed, epoch). A batch is just the next B positions, so
the order does not depend on the batch size, the accumulation or where an attempt began:
an attempt resumed at `samples_seen` continues with exactly the sample that came next.
"""

from __future__ import annotations

import torch


class SampleOrder:
    def __init__(self, num_samples: int, seed: int):
        self.num_samples = num_samples
        self.seed = seed
        self._epoch = -1
        self._perm: torch.Tensor | None = None

    def _permutation(self, epoch: int) -> torch.Tensor:
        perm = self._perm
        if epoch != self._epoch or perm is None:
            # modulo 2**64: a large seed times 1_000_003 would overflow manual_seed's 64 bits
            g = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) % 2**64)
            perm = self._perm = torch.randperm(self.num_samples, generator=g)
            self._epoch = epoch
        return perm

    def indices(self, start: int, count: int) -> torch.Tensor:
        """Dataset indices for sample positions start .. start+count-1 (may span epochs)."""
        parts = []
        while count > 0:
            epoch, offset = divmod(start, self.num_samples)
            take = min(count, self.num_samples - offset)
            parts.append(self._permutation(epoch)[offset:offset + take])
            start, count = start + take, count - take
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def epoch_of(self, position: int) -> int:
        return position // self.num_samples
