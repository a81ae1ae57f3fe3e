"""DeviceProfile: the bit widths and block shapes this machine's kernels run, and what a block costs.

Costs are measured, never assumed: for each (bits, block shape) a kernel over a random
pattern of such blocks (a quarter of them kept) is built and timed, and the time divided by
(kept blocks x activation rows) is the cost of one block for one row. Dense costs per
element come from PyTorch's dense linear (fp32) and our int8 kernel with every weight kept.
Profiles are cached on disk under a key of CPU model, flags, threads and kernel version.

Example:
    >>> dev = DeviceProfile.load_or_measure()            # doctest: +SKIP
    >>> dev.block_ns(32, (32, 32)), dev.bits             # doctest: +SKIP
    (40.1, (8, 32))
"""

from __future__ import annotations

import json
import os
import platform
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from sparta_explore.cache import atomic_write, content_key, resolve_cache_dir
from sparta_explore.timing import interleaved_ms

PROFILE_VERSION = 9  # 4: int8 dense on VNNI; 5: scattered rows step one word at a time; 6: flat loops, int8 K panels;
# 7: tall blocks measured with their own default tiling (`tuning.default_tile`); 8: K panels as large as L1;
# 9: one-word segments below 8 words (groups.SHORT_SEGMENTS), the permute kernel's runs of cells
BLOCKS: tuple[tuple[int, int], ...] = ((1, 1), (1, 32), (16, 16), (32, 32), (32, 64), (64, 32), (64, 64))
FP32, INT8 = 32, 8


@dataclass(frozen=True)
class ProfileShape:
    """The reference problem the costs are measured on: weight out x in, `m` activation rows, kept share.

    Example:
        >>> ProfileShape(quick=True).m
        64
    """

    out_features: int = 768
    in_features: int = 768
    m: int = 256
    kept_blocks: float = 0.25
    repeats: int = 7
    quick: bool = False

    def __post_init__(self) -> None:
        if self.quick:  # tests and first runs: small problem, same method
            object.__setattr__(self, "out_features", 256)
            object.__setattr__(self, "in_features", 256)
            object.__setattr__(self, "m", 64)
            object.__setattr__(self, "repeats", 3)


@dataclass(frozen=True)
class DeviceProfile:
    """What this machine runs (bit widths, block shapes) and the measured nanoseconds each costs.

    `block_costs[(bits, h, w)]` is ns per kept block per activation row; `dense_costs[bits]`
    ns per weight element per row of a dense op; `op_overhead_us` the fixed cost of a call.

    Example:
        >>> dev = DeviceProfile.load_or_measure(quick=True)   # doctest: +SKIP
        >>> dev.predict_ms(n_blocks=100, block=(32, 32), bits=32, m=4096)  # doctest: +SKIP
        0.41
    """

    key: str
    cpu: str
    threads: int
    bits: tuple[int, ...]
    blocks: tuple[tuple[int, int], ...]
    block_costs: dict[tuple[int, int, int], float] = field(hash=False)
    dense_costs: dict[int, float] = field(hash=False)
    op_overhead_us: float = 20.0
    seconds: float = 0.0

    def block_ns(self, bits: int, block: tuple[int, int]) -> float:
        """ns for one kept `block` at `bits` per activation row.

        Example:
            >>> dev.block_ns(8, (1, 32))  # doctest: +SKIP
        """
        try:
            return self.block_costs[(bits, *block)]
        except KeyError:
            raise KeyError(f"device profile has no cost for bits={bits}, block={block}; "
                           f"it runs bits {self.bits} and blocks {self.blocks}") from None

    def predict_ms(self, *, n_blocks: int, block: tuple[int, int], bits: int, m: int) -> float:
        """Predicted time of a block-sparse sub-operator with `n_blocks` kept blocks over `m` rows.

        Example:
            >>> dev.predict_ms(n_blocks=10, block=(1, 1), bits=32, m=1)  # doctest: +SKIP
        """
        return (n_blocks * self.block_ns(bits, block) * m) / 1e6 + self.op_overhead_us / 1e3

    def dense_ms(self, *, out_features: int, in_features: int, bits: int, m: int) -> float:
        """Predicted time of a dense op of this size at `bits`.

        Example:
            >>> dev.dense_ms(out_features=3072, in_features=768, bits=32, m=4096)  # doctest: +SKIP
        """
        return out_features * in_features * m * self.dense_costs[bits] / 1e6 + self.op_overhead_us / 1e3

    def round_bits(self, bits: int) -> int:
        """The narrowest width this device runs that holds `bits` (0 stays 0: pruned).

        Example:
            >>> dev.round_bits(3), dev.round_bits(12)  # doctest: +SKIP
            (8, 32)
        """
        if bits == 0:
            return 0
        for width in sorted(self.bits):
            if bits <= width:
                return width
        raise ValueError(f"bits={bits} exceeds every width this device runs {self.bits}")

    def to_json(self) -> str:
        """JSON text of the profile (tuple keys spelled 'bits:h:w').

        Example:
            >>> DeviceProfile.from_json(dev.to_json()) == dev  # doctest: +SKIP
            True
        """
        d = asdict(self)
        d["block_costs"] = {":".join(map(str, k)): v for k, v in self.block_costs.items()}
        d["dense_costs"] = {str(k): v for k, v in self.dense_costs.items()}
        return json.dumps(d, indent=1)

    @classmethod
    def from_json(cls, text: str) -> DeviceProfile:
        """The profile `to_json` wrote.

        Example:
            >>> DeviceProfile.from_json(text)  # doctest: +SKIP
        """
        d = json.loads(text)
        d["bits"] = tuple(d["bits"])
        d["blocks"] = tuple(tuple(b) for b in d["blocks"])
        d["block_costs"] = {tuple(int(v) for v in k.split(":")): c for k, c in d["block_costs"].items()}
        d["dense_costs"] = {int(k): c for k, c in d["dense_costs"].items()}
        return cls(**d)

    @classmethod
    def load_or_measure(cls, *, cache_dir: str | os.PathLike | None = None, quick: bool = False,
                        shape: ProfileShape | None = None) -> DeviceProfile:
        """This machine's profile from the cache, measuring it (under a minute) on a miss.

        Example:
            >>> dev = DeviceProfile.load_or_measure()  # doctest: +SKIP
        """
        shape = shape or ProfileShape(quick=quick)
        key = machine_key(shape)
        path = resolve_cache_dir(cache_dir, "device") / f"{key}.json"
        if path.exists():
            try:
                return cls.from_json(path.read_text())
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                warnings.warn(f"device profile {path} is unreadable ({type(e).__name__}: {e}); measuring it again",
                              RuntimeWarning, stacklevel=2)
        profile = measure_profile(shape, key=key, cache_dir=cache_dir)
        atomic_write(path, lambda f: f.write(profile.to_json().encode()))
        return profile


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo), or the platform's processor string.

    Example:
        >>> isinstance(cpu_model(), str)
        True
    """
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key(shape: ProfileShape) -> str:
    """Cache key: CPU model and flags, threads, compiler, kernel and profile versions, reference shape.

    Example:
        >>> len(machine_key(ProfileShape(quick=True)))
        16
    """
    from sparta_explore.kernels.build import compiler_version, cpu_flags
    from sparta_explore.kernels.tuning import TUNING_VERSION

    return content_key({"cpu": cpu_model(), "flags": sorted(cpu_flags()), "threads": torch.get_num_threads(),
                        "cc": compiler_version(), "kernels": TUNING_VERSION, "profile": PROFILE_VERSION,
                        "shape": asdict(shape)})[:16]


SETTLE_ROUNDS = 2  # with `settle`, rounds after which a clear winner ends the timing
SETTLE_MARGIN = 0.8  # clear: the winner's slowest run under this share of every other's fastest


def fastest_ms(fns: dict, x: torch.Tensor, rounds: int, settle: bool = False) -> dict:
    """Fastest time (ms) of each function on `x`, timed in interleaved rounds.

    The fastest run, not the median: a cost model wants this machine's speed, not its
    neighbours' load; interleaving spreads any burst of load over every function instead
    of spoiling the one that happened to run during it. `settle` (a race: only the winner
    matters) stops after `SETTLE_ROUNDS` rounds when even the winner's slowest run beat every
    other's fastest by `SETTLE_MARGIN`: more rounds only lower the others' minimums by what
    their own noise allows (a dense candidate 4x slower than its sparse kernel, a fused pair).
    A lone function in a race is timed one round after its warm-up: there is nothing to beat, its
    time only checks the prediction it was chosen by (BERT-base, 72 ops that each build one near
    candidate: 0.4 of 0.8 s of compile's timing at `SETTLE_ROUNDS` rounds).

    Example:
        >>> sorted(fastest_ms({"a": torch.relu, "b": torch.tanh}, torch.ones(4), rounds=3))
        ['a', 'b']
    """
    for fn in fns.values():
        fn(x)
    first = min(rounds, SETTLE_ROUNDS if len(fns) > 1 else 1) if settle else rounds
    times = interleaved_ms(list(fns.values()), first, (x,))
    if first < rounds and not _parted(times):
        times = [a + b for a, b in zip(times, interleaved_ms(list(fns.values()), rounds - first, (x,)))]
    return {key: min(ts, default=float("inf")) for key, ts in zip(fns, times)}


def _parted(times: list[list[float]]) -> bool:
    """Whether one function's slowest run is under `SETTLE_MARGIN` of every other's fastest."""
    win = min(range(len(times)), key=lambda i: max(times[i]))
    return all(max(times[win]) < SETTLE_MARGIN * min(t) for i, t in enumerate(times) if i != win)


def _block_pattern(shape: ProfileShape, block: tuple[int, int], gen: torch.Generator) -> tuple[torch.Tensor, int]:
    h, w = block
    nb_r, nb_c = shape.out_features // h, shape.in_features // w
    blocks = torch.rand(nb_r, nb_c, generator=gen) < shape.kept_blocks
    kept = blocks.repeat_interleave(h, 0).repeat_interleave(w, 1)
    return kept, int(blocks.sum())


def measure_profile(shape: ProfileShape, *, key: str = "", cache_dir: str | os.PathLike | None = None
                    ) -> DeviceProfile:
    """Build and time one kernel per (bits, block shape) on `shape`; see the module docstring.

    Example:
        >>> measure_profile(ProfileShape(quick=True)).bits  # doctest: +SKIP
        (8, 32)
    """
    import torch.nn.functional as F

    from sparta_explore.kernels import Int8SparseLinear, SparseLinear, compiler_available, cpu_flags
    from sparta_explore.kernels.build import warn_compiler_missing
    from sparta_explore.kernels.tuning import default_tile

    start = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    n, k, m = shape.out_features, shape.in_features, shape.m
    weight = torch.randn(n, k, generator=gen)
    x = torch.randn(m, k, generator=gen)
    if not compiler_available():  # PyTorch's dense kernels are all this machine can run
        warn_compiler_missing()
        bits, blocks = (FP32,), ()
    else:
        bits = (INT8, FP32) if "avx2" in cpu_flags() else (FP32,)
        blocks = BLOCKS
    builders = {FP32: SparseLinear, INT8: Int8SparseLinear}
    ops, blocks_of = {}, {}
    for b in bits:
        for block in blocks:
            kept, blocks_of[(b, *block)] = _block_pattern(shape, block, gen)
            tile = {"tile": default_tile(kept.numpy(), block[0], m)} if b == FP32 else {}
            ops[(b, *block)] = builders[b](weight, None, kept, block_rows=block[0], cache_dir=cache_dir, check=False,
                                           **tile)
    ops[("dense", FP32)] = lambda t: F.linear(t, weight)
    if INT8 in bits:  # the int8 kernel with every weight kept: what dense costs at 8 bits
        ops[("dense", INT8)] = Int8SparseLinear(weight, None, torch.ones(n, k, dtype=torch.bool), cache_dir=cache_dir,
                                                check=False)
    best = fastest_ms(ops, x, shape.repeats)
    costs = {key: best[key] * 1e6 / (max(blocks_of[key], 1) * m) for key in blocks_of}
    dense = {b: best[("dense", b)] * 1e6 / (n * k * m) for b in bits}
    tiny = torch.randn(1, 8)
    overhead = fastest_ms({"tiny": lambda t: F.linear(t, torch.ones(8, 8))}, tiny, 50)["tiny"] * 1e3
    return DeviceProfile(key=key, cpu=cpu_model(), threads=torch.get_num_threads(), bits=bits, blocks=blocks,
                         block_costs=costs, dense_costs=dense, op_overhead_us=overhead,
                         seconds=time.perf_counter() - start)
