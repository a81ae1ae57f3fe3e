"""The machine a latency was measured on: CPU model, the ISA flags the kernels use, threads.

Latency from two machines is not comparable, so every results row records where it was
measured (`Machine.columns`), fronts refuse rows from several machines unless asked to mix
them and reports group rows by machine (the exploration package's `check_one_machine` and
`machines_of`), and device profiles are cached per machine (`device.machine_key`).
The flags are the ones under the kernels' ISA ceiling (`kernels.build.cpu_flags`), so a
run lowered to ``--isa avx2`` counts as a different machine, which it is for the kernels.

Example:
    >>> m = this_machine()
    >>> sorted(m.columns()) == ["cpu_flags", "cpu_model", "machine"], len(m.key)
    (True, 12)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sparta_explore.cache import content_key
from sparta_explore.device import cpu_model

# the flags that pick kernel paths; the rest of /proc/cpuinfo's list would only add noise to the label
KERNEL_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16",
                "amx_int8")


@dataclass(frozen=True)
class Machine:
    """One measuring machine; `key` identifies it in results (same CPU, flags and threads = same key).

    Example:
        >>> Machine("AMD EPYC 7B13", ("avx2", "fma"), 2).label
        'AMD EPYC 7B13 (avx2 fma), 2 threads'
    """

    cpu_model: str
    flags: tuple[str, ...]
    threads: int

    @property
    def key(self) -> str:
        """A 12-character hash of model, flags and threads."""
        return content_key({"cpu": self.cpu_model, "flags": list(self.flags), "threads": self.threads})[:12]

    @property
    def label(self) -> str:
        """What a report prints for it."""
        return f"{self.cpu_model} ({' '.join(self.flags)}), {self.threads} threads"

    def columns(self) -> dict[str, str]:
        """The results-row columns naming it: machine (the key), cpu_model, cpu_flags (space-separated)."""
        return {"machine": self.key, "cpu_model": self.cpu_model, "cpu_flags": " ".join(self.flags)}


def this_machine(threads: int | None = None) -> Machine:
    """The machine this process measures on, with `threads` (default: torch's intra-op threads).

    Example:
        >>> this_machine(threads=1).threads
        1
    """
    from sparta_explore.kernels.build import cpu_flags

    flags = cpu_flags()
    return Machine(cpu_model(), tuple(f for f in KERNEL_FLAGS if f in flags),
                   torch.get_num_threads() if threads is None else threads)
