"""Triton import guard: `HAVE_TRITON`, and `triton`/`tl` (None without Triton)."""

from __future__ import annotations

import contextlib
import contextvars
import os

import torch

try:  # Triton is optional: the package and its CPU paths work without it.
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised on machines without triton
    triton = None
    tl = None
    HAVE_TRITON = False

__all__ = [
    "HAVE_TRITON",
    "triton",
    "tl",
    "interpreting",
    "require_triton",
    "bf16_out_like",
    "round_bf16",
    "round_bf16_bits",
    "round_bf16_cvt",
    "round_bf16_inner",
    "ROUND_ENV",
    "e4m3_value",
    "e2m1_value",
    "e8m0_scale",
    "ArrivalCounters",
    "pdl_launch",
    "PDL_ENV",
    "MIN_CAPABILITY",
    "PACKED_MIN_CAPABILITY",
    "TESTED_CAPABILITIES",
    "device_capability",
    "device_shared_bytes",
    "MIN_SHARED_BYTES",
    "kernel_support",
    "check_kernel_device",
    "on_device",
    "counters_of",
    "current_counters",
]

# How `round_bf16` rounds on CUDA, read at import: "cvt" (the default), the hardware
# conversion (cvt.rn.bf16.f32) with NaN made canonical; "bits", explicit bit arithmetic.
# The same bits either way (tests/kernels/test_round.py checks both on the GPU; every kernel
# test passed under each on the H200); the interpreter always takes "bits", whose cast
# truncates. H200, 2026-12-03 (scripts/batch_kernel_probe.py, the kernels alone): cvt takes
# the batched attention from 70.0 to 66.9 µs (packed rows 86.0 to 82.8) and the index
# scores over 1M keys from 92.6 to 81.6 µs.
ROUND_ENV = "ATTNV41_ROUND_BF16"
ROUND_BF16 = os.environ.get(ROUND_ENV, "cvt")
if ROUND_BF16 not in ("bits", "cvt"):
    raise ValueError(f"{ROUND_ENV} = {ROUND_BF16!r}; allowed: 'bits', 'cvt'")
if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    ROUND_BF16 = "bits"

if HAVE_TRITON:

    @triton.jit
    def round_bf16_bits(x):
        """fp32 → bf16, round to nearest even, every NaN → the canonical NaN 0x7FC0 (as
        torch's cast), ±inf and overflow as the cast gives them, by bit arithmetic.

        On CUDA the same bits as `round_bf16_cvt`; Triton 3.6's interpreter truncates in
        the cast, and the kernels' tests must see the rounding that runs on the GPU, so it
        takes this form. The NaN case must not go through the carry: the GPU's NaN
        0x7FFFFFFF plus the rounding increment wraps into the sign bit and would come out
        as −0, turning a NaN into a finite zero.
        """
        # [same shape as x] fp32 bits
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        bits = tl.where(x != x, 0x7FC00000, bits)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)

    @triton.jit
    def round_bf16_cvt(x):
        """`round_bf16_bits` by the hardware conversion (CUDA only): it rounds to nearest
        even and keeps ±inf, overflow and subnormals as the bit arithmetic does; its NaN
        (0x7FFF) is replaced by 0x7FC0."""
        y = x.to(tl.bfloat16)
        nan = tl.full(x.shape, 0x7FC0, tl.uint16).to(tl.bfloat16, bitcast=True)
        return tl.where(x != x, nan, y)

    # fp32 → bf16 as every kernel stores and rounds (ROUND_BF16 above)
    round_bf16 = round_bf16_cvt if ROUND_BF16 == "cvt" else round_bf16_bits

    # fp32 → bf16 → fp32 for two values ($2, $3 → $0, $1) by one cvt: `round_bf16_plain_cvt`'s
    # PTX, shared with the Gluon kernels that must round as it does (`indexer_gluon`)
    ROUND_BF16_PAIR_PTX = tl.constexpr(
        "{\n.reg .b32 t;\ncvt.rn.bf16x2.f32 t, $3, $2;\nshl.b32 $0, t, 16;\nand.b32 $1, t, 0xFFFF0000;\n}"
    )

    @triton.jit
    def round_bf16_plain_cvt(x):
        """fp32 → bf16 → fp32 by the hardware conversion alone (round to nearest even; a NaN
        keeps the hardware's payload, 0x7FFF, instead of torch's 0x7FC0): two values per
        cvt.rn.bf16x2.f32, back to fp32 by a shift and a mask."""
        return tl.inline_asm_elementwise(
            ROUND_BF16_PAIR_PTX,
            "=r,=r,r,r",
            [x],
            dtype=tl.float32,
            is_pure=True,
            pack=2,
        )

    # `round_bf16(x).to(fp32)` for an intermediate whose NaN payload cannot reach memory: one that
    # `tl.maximum` turns into 0 (its NaN-dropping max), or that reaches memory only through
    # a later `round_bf16`, which makes every NaN canonical. Its bits are `round_bf16`'s
    # otherwise, without the NaN test and select per value (the "bits" form under the
    # interpreter and ATTNV41_ROUND_BF16=bits).
    @triton.jit
    def _round_bf16_bits_f32(x):
        return round_bf16_bits(x).to(tl.float32)

    round_bf16_inner = round_bf16_plain_cvt if ROUND_BF16 == "cvt" else _round_bf16_bits_f32


if HAVE_TRITON:
    # The packed formats' codes and scales (attnv41.packed) → their fp32 values, exactly:
    # the dequantization of every kernel that reads packed rows, in few instructions per
    # element (it runs once per element read, on CUDA cores beside the dot).

    @triton.jit
    def e4m3_value(b):
        """uint8 e4m3 bit patterns (finite: torch.float8_e4m3fn) → fp32, exactly: the
        hardware conversion (sm_89+: two values per instruction; the interpreter emulates
        it, equal on every finite code)."""
        return b.to(tl.float8e4nv, bitcast=True).to(tl.float32)

    @triton.jit
    def e2m1_value(nib):
        """int32 e2m1 nibbles (bit 3 the sign, bits 0-2 the magnitude's index in {0, 0.5,
        1, 1.5, 2, 3, 4, 6}) → fp32, exactly, in three integer ops and one multiply: the
        nibble's exponent and mantissa bits placed as fp32's lowest exponent bits and top
        mantissa bit (sign on bit 31) make the value · 2^-126 (index 1: the subnormal
        2^-127), and the multiply by 2^126 is exact (no flush to zero: Triton's fp32
        multiply keeps subnormals, as the interpreter's)."""
        bits = ((nib & 7) << 22) | ((nib & 8) << 28)
        return bits.to(tl.float32, bitcast=True) * 8.507059173023462e37  # 2^126

    @triton.jit
    def e8m0_scale(e):
        """int32 e8m0 bytes e in 1..254 → the fp32 scale 2^(e − 127)."""
        return (e << 23).to(tl.float32, bitcast=True)


if HAVE_TRITON:

    @triton.jit
    def pdl_release(PDL: tl.constexpr):
        """Programmatic dependent launch, first half: the next kernel in the stream may start
        its programs now (they run up to their `pdl_wait` and no further). No memory
        ordering is implied; every kernel calls it at its start."""
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def pdl_wait(PDL: tl.constexpr):
        """Programmatic dependent launch, second half: block until the previous kernel in the
        stream has finished and its writes are visible. Every kernel launched with PDL calls
        it before it reads or writes any buffer another kernel writes or reads (only
        weights, constant for the step, may be touched before it), so the stream's order
        holds for memory exactly as without PDL, and transitively (a kernel completes only
        after its wait returned, i.e. after its predecessor completed). One exception, by
        construction: a kernel whose predecessor releases it only after that predecessor's
        own wait returned may read, before its wait, what the kernels before the
        predecessor wrote (they have all finished by then): the decode attention's block
        combine (`sparse_attn_split`, `early_rows`)."""
        if PDL:
            tl.extra.cuda.gdc_wait()

    @triton.jit
    def prefetch_l2(ptrs):
        """Ask L2 for the 128-byte lines holding `ptrs` (any shape of valid addresses; no
        value is read into registers, nothing waits for it): a weight's first chunks fetched
        while the previous kernel finishes (PDL)."""
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1]; // $0", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
        )


PDL_ENV = "ATTNV41_PDL"
# On by default ("0": off). H200, one run (BENCHMARKS.md, 2026-12-03 third entry): decode
# step 4.26 -> 4.20 ms at batch 1, BatchGraphs 8.14 -> 8.02 ms at B = 64; the quick GPU tier
# (1,107 passed, 0 failed) and the PDL on == off byte test passed with it on.
PDL_DEFAULT = "1"


def pdl_launch(t: torch.Tensor) -> dict:
    """The launch keywords for programmatic dependent launch (PDL) of a kernel whose tensors
    live on t's device: `dict(PDL=True, launch_pdl=True)` on a CUDA device of compute
    capability 9.0 or newer (Hopper: the kernel's programs may start while the previous
    kernel finishes, and wait for it in `pdl_wait`), else `dict(PDL=False)` (the
    interpreter, older GPUs, or `ATTNV41_PDL=0` in the environment; `PDL_DEFAULT` when
    the variable is unset). Same bits either way:
    PDL moves when programs start, not what they compute; graphs capture it."""
    if t.device.type != "cuda" or interpreting() or os.environ.get(PDL_ENV, PDL_DEFAULT) == "0":
        return {"PDL": False}
    return {"PDL": True, "launch_pdl": True} if device_capability(t.device)[0] >= 9 else {"PDL": False}


def interpreting() -> bool:
    """Whether Triton runs kernels on the CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# The CUDA devices the kernels run on (`kernel_support`). Every layer's fp8 round trips
# convert e4m3 values, and Triton compiles that type (fp8e4nv) only from sm_89. The tiles
# need up to 160 KiB of shared memory per block on sm_90 (tc_mm over the compressor's fp32
# weights; the prefill attention 128 KiB), and Triton refuses a launch asking more than the
# device offers (sm_89 and sm_12x offer 99 KiB; there the prefill attention compiles to 192
# KiB: offline compiles, 2026-12-05). Packed caches are dequantized by PTX that multiplies
# bf16 pairs (mul.rn.bf16x2), an sm_90 instruction. Measured and tested on sm_90 only.
MIN_CAPABILITY = (8, 9)
PACKED_MIN_CAPABILITY = (9, 0)
MIN_SHARED_BYTES = 160 * 1024
TESTED_CAPABILITIES = ((9, 0),)
_capability: dict[int, tuple[int, int]] = {}
_shared_bytes: dict[int, int] = {}
_supported: set[int] = set()  # CUDA devices `require_triton` found the kernels run on


def device_capability(device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device (an index, "cuda:N" or a
    torch.device; "cuda" is the current one), asked once per device."""
    if isinstance(device, torch.device) and device.index is not None:  # the launches' case: a tensor's device
        cap = _capability.get(device.index)
        if cap is not None:
            return cap
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    cap = _capability.get(idx)
    if cap is None:
        cap = _capability[idx] = tuple(torch.cuda.get_device_capability(idx))
    return cap


def device_shared_bytes(device) -> int:
    """The shared memory one block of a CUDA device may use (opt-in), asked once per device."""
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    n = _shared_bytes.get(idx)
    if n is None:
        n = getattr(torch.cuda.get_device_properties(idx), "shared_memory_per_block_optin", None)
        if n is None:  # a torch without the field: Triton's driver asks the same attribute
            n = triton.runtime.driver.active.utils.get_device_properties(idx)["max_shared_mem"]
        n = _shared_bytes[idx] = int(n)
    return n


def kernel_support(device, packed: bool = False) -> str | None:
    """None when the Triton kernels run on this CUDA device (with packed caches: their
    dequantization too), or under the interpreter; else why not, as one line naming the
    device, the property that fails and the allowed range."""
    if not HAVE_TRITON:
        return f"{device}: Triton is not installed; allowed: with triton installed (its wheels cover Linux x86-64)"
    if interpreting():
        return None
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    cap = device_capability(device)
    name = torch.cuda.get_device_name(device)
    if cap < MIN_CAPABILITY:
        return (
            f"{device} ({name}) has compute capability {cap[0]}.{cap[1]}; allowed: {MIN_CAPABILITY[0]}."
            f"{MIN_CAPABILITY[1]} or newer (the kernels convert e4m3 values, which Triton compiles only from sm_89)"
        )
    shared = device_shared_bytes(device)
    if shared < MIN_SHARED_BYTES:
        return (
            f"{device} ({name}) offers {shared} bytes of shared memory per block; allowed: {MIN_SHARED_BYTES} or "
            "more (the kernels' tiles: up to 160 KiB per block on sm_90; Triton refuses a launch asking more than "
            "the device offers)"
        )
    if packed and cap < PACKED_MIN_CAPABILITY:
        return (
            f"{device} ({name}) has compute capability {cap[0]}.{cap[1]}; allowed with packed caches: "
            f"{PACKED_MIN_CAPABILITY[0]}.{PACKED_MIN_CAPABILITY[1]} or newer (their dequantization multiplies bf16 "
            "pairs, mul.rn.bf16x2, an sm_90 instruction)"
        )
    return None


def check_kernel_device(device, what: str, packed: bool = False) -> None:
    """ValueError (`what`: the caller, named first) unless `kernel_support` answers None
    for this CUDA device: a refusal before anything is allocated or launched, instead of a
    compile error inside the first kernel. The CPU path (torch twins) has no such limit."""
    why = kernel_support(device, packed)
    if why is not None:
        raise ValueError(f"{what}: device {why}; or device='cpu' (the torch path)")


_SAME_DEVICE = contextlib.nullcontext()


def on_device(device):
    """`torch.cuda.device(device)` when `device` is a CUDA device other than the current
    one, else a no-op context. Triton launches on the current device, whatever device its
    tensors live on (and CUDA graphs capture and replay on the current device's streams),
    so the runtimes run each call under it: a runtime on cuda:1 works while the current
    device is cuda:0, as torch's own ops do."""
    if device.type == "cuda" and device.index is not None and torch.cuda.current_device() != device.index:
        if torch.cuda.is_current_stream_capturing():  # the work would run, uncaptured, on the other device
            raise RuntimeError(
                f"a call on {device} inside a CUDA graph capture on cuda:{torch.cuda.current_device()}; allowed: "
                f"capture on {device} (under torch.cuda.device({device.index}))"
            )
        return torch.cuda.device(device)
    return _SAME_DEVICE


def require_triton(op: str, *tensors) -> None:
    """Raise a clear error unless a Triton launch of `op` on these tensors can run: Triton
    installed (RuntimeError), each tensor on a CUDA device (or the interpreter; RuntimeError)
    the kernels run on (ValueError from `check_kernel_device`: the capability and shared
    memory rule of `kernel_support`, asked once per device)."""
    if not HAVE_TRITON:
        raise RuntimeError(f"{op}: Triton is not installed")
    for t in tensors:
        if t.device.type != "cuda":
            if interpreting():
                return
            raise RuntimeError(f"{op}: tensor on {t.device}; allowed: a CUDA tensor, or set TRITON_INTERPRET=1")
    # the device's verdict, asked once per device (a refused one stays unmarked: asked again)
    if tensors and tensors[0].device.index not in _supported:
        check_kernel_device(tensors[0].device, op)
        _supported.add(tensors[0].device.index)


def bf16_out_like(x, out):
    """`out` checked to fit x (shape, bf16, device, contiguous last dim), or a new tensor
    like x when None. ValueError names the field and the allowed value."""
    if out is None:
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"out = {type(out).__name__}; allowed: None or a torch.Tensor")
    if tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"out.shape = {tuple(out.shape)}; allowed: {tuple(x.shape)} (the shape of x)")
    if out.dtype != torch.bfloat16:
        raise ValueError(f"out.dtype = {out.dtype}; allowed: torch.bfloat16")
    if out.device != x.device:
        raise ValueError(f"out.device = {out.device}; allowed: {x.device} (the device of x)")
    if out.shape[-1] > 1 and out.stride(-1) != 1:
        raise ValueError(f"out.stride(-1) = {out.stride(-1)}; allowed: 1 (contiguous last dim)")
    return out


# The counters' owner in effect (`counters_of`): a runtime's own dict, or None for the
# module-wide buffers of direct kernel calls.
_COUNTER_OWNER: contextvars.ContextVar[dict | None] = contextvars.ContextVar("attnv41_counters", default=None)


def current_counters() -> dict | None:
    """The counters' owner in effect (`counters_of`), None outside any."""
    return _COUNTER_OWNER.get()


class counters_of:  # noqa: N801 (a context manager used like a function)
    """Inside `with counters_of(owner)` (owner: a dict the caller keeps), every split kernel
    takes its arrival counters from `owner`, allocated there on first use, instead of the
    module-wide buffers. Each runtime passes its own (`runtime.device.on_own_device`), so
    two runtimes on one GPU may run at once on different streams, or replay their graphs at
    once: each launch, and each captured graph, holds its runtime's counters. `None`:
    the module-wide buffers."""

    __slots__ = ("owner", "_token")

    def __init__(self, owner: dict | None):
        self.owner = owner

    def __enter__(self):
        self._token = _COUNTER_OWNER.set(self.owner)
        return self.owner

    def __exit__(self, *exc):
        _COUNTER_OWNER.reset(self._token)
        return False


class ArrivalCounters:
    """Per-device int32 arrival counters (zeros) for split-K kernels whose last program to
    arrive combines the partials and resets its counter. Outside `counters_of` they are
    allocated once per device and shared by every launch of one module (direct kernel
    calls: two such launches must not run at once on different streams); inside it, per
    owner (a runtime's calls, which run in order) and device. `prepare` allocates them
    (before a CUDA graph capture whose first launch of the module is inside it); `buffer`
    returns them, allocating on first use and refusing to inside a capture."""

    def __init__(self, op: str, prepare_name: str, size: int):
        self.op, self.prepare_name, self.size = op, prepare_name, size
        self._bufs: dict = {}

    @staticmethod
    def _device(device) -> torch.device:
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        return dev

    def _where(self, dev: torch.device) -> tuple[dict, object]:
        """(the dict holding this module's counters on dev, their key in it)."""
        owner = _COUNTER_OWNER.get()
        return (self._bufs, dev) if owner is None else (owner, (self.op, dev))

    def prepare(self, device) -> None:
        dev = self._device(device)
        bufs, key = self._where(dev)
        if key not in bufs:
            bufs[key] = torch.zeros(self.size, dtype=torch.int32, device=dev)

    def buffer(self, device) -> torch.Tensor:
        dev = self._device(device)
        bufs, key = self._where(dev)
        if key not in bufs:
            if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"{self.op}: first call on {dev} inside a CUDA graph capture; call "
                    f"{self.prepare_name}(device) (or run one step eagerly) before capturing"
                )
            self.prepare(dev)
        return bufs[key]
