"""Which GEMM library runs the model's float32 linear layers on a CPU: torch's default or oneDNN.

torch sends a float32 ``F.linear`` on a CPU to its BLAS (MKL in the x86 wheels). oneDNN, which torch
also ships and uses for bf16, measured faster for this model family's shapes on an AMD EPYC without
bf16 instructions: forward and input-gradient products of a 576-wide model ran at 67-81 GFLOPS through
oneDNN against 51-64 through MKL on one core, and the 49k-row LM head over 8 decoding rows 19 ms
against 26. The weight-gradient product showed no such gain, so it stays with torch's ``mm``.

``engine.fp32_linear``:
- ``torch``: torch's own ``F.linear`` everywhere (the previous behaviour);
- ``onednn``: every ``nn.Linear`` of the model computes its float32 forward and input gradient with
  oneDNN (``OneDnnLinear``) and ``LeanLlama`` decodes with it too;
- ``auto``: ``onednn`` where the machine runs float32 (see ``runtime.precision``), oneDNN is
  built in, the model is at least ``MIN_WIDTH`` wide and oneDNN measures ≥ ``MIN_SPEEDUP``× faster on
  the model's own layer shapes (``onednn_speedup``), else ``torch``. Logged either way. The choice
  depends on a timing and, unlike ``precision: auto`` (decided once per run and recorded in its
  checkpoints), is made again by every process: a resumed run may choose differently, so pin it where
  a resume must be bit-exact.

Under bf16 autocast (or for any non-float32 or non-CPU tensor) the patched layers defer to
``F.linear``, so a bf16 run computes exactly what it did before. The two libraries round differently:
a model's outputs agree to float32 rounding, not bit for bit, so pin ``engine.fp32_linear`` when runs
must match across machines. Each library is deterministic on its own (same shapes, same threads).
"""

from __future__ import annotations

import logging
import time
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from envace.runtime.precision import device_type, time_ratio

logger = logging.getLogger(__name__)

FP32_LINEARS = ("auto", "torch", "onednn")
MIN_SPEEDUP = 1.05  # auto picks oneDNN only when it measures at least this much faster
MIN_WIDTH = 256  # narrower models keep torch's GEMM under auto without a timing
PROBE_TOKENS = 512
PROBE_RUNS = 3


def onednn_available() -> bool:
    """Whether this torch build has oneDNN's linear kernel on the CPU."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _dnn_mm(a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``a @ weight.T`` by oneDNN (``a`` [M, K] and ``weight`` [N, K], both contiguous float32)."""
    return torch.ops.mkldnn._linear_pointwise(a, weight, None, "none", [], "")


class OneDnnLinear(torch.autograd.Function):
    """``F.linear`` whose forward and input gradient run through oneDNN (float32, CPU); the weight
    gradient is torch's ``mm``. Saves the same two tensors for backward as ``F.linear`` does."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        out = _dnn_mm(flat, weight.contiguous())
        if bias is not None:
            out += bias
        return out.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        flat_grad = grad.reshape(-1, grad.shape[-1]).contiguous()
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _dnn_mm(flat_grad, weight.t().contiguous()).view(x.shape)
        if ctx.needs_input_grad[1]:
            grad_w = torch.mm(flat_grad.t(), x.reshape(-1, x.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = flat_grad.sum(0)
        return grad_x, grad_w, grad_b


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through oneDNN where it applies (float32 CPU tensors, no autocast);
    anything else goes to ``F.linear`` unchanged."""
    if (
        x.dtype is not torch.float32
        or weight.dtype is not torch.float32
        or x.device.type != "cpu"
        or x.dim() < 2
        or x.numel() == 0
        or torch.is_autocast_enabled("cpu")
    ):
        return F.linear(x, weight, bias)
    return OneDnnLinear.apply(x, weight, bias)


def _onednn_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return onednn_linear(x, self.weight, self.bias)


def _linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


def set_fp32_linear(model: torch.nn.Module, backend: str) -> None:
    """Make every plain ``nn.Linear`` of ``model`` (LoRA's base and adapter layers included) run on
    ``backend`` (``torch`` | ``onednn``). Reversible; a deep copy of the model keeps the setting."""
    if backend not in ("torch", "onednn"):
        raise ValueError(f"fp32_linear backend {backend!r}; valid: torch, onednn (auto is resolved first)")
    for module in _linears(model):
        if backend == "onednn":
            module.forward = types.MethodType(_onednn_forward, module)
        else:
            module.__dict__.pop("forward", None)


def fp32_linear_of(model: torch.nn.Module) -> str:
    """``onednn`` when ``set_fp32_linear(model, "onednn")`` is in force (judged by its LM head or first
    linear layer), else ``torch``."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    layer = head if type(head) is torch.nn.Linear else next(iter(_linears(model)), None)
    forward = layer.__dict__.get("forward") if layer is not None else None
    return "onednn" if getattr(forward, "__func__", None) is _onednn_forward else "torch"


def linear_fn(model: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """The ``F.linear`` stand-in matching ``model``'s setting (for code that calls linear directly)."""
    return onednn_linear if fp32_linear_of(model) == "onednn" else F.linear


_SPEEDUPS: dict[tuple, float] = {}


def _cached_ratio(key: tuple, torch_work: Callable[[], Any], onednn_work: Callable[[], Any]) -> float:
    """``time_ratio`` of two zero-argument workloads (torch's time over oneDNN's), measured once per ``key``
    for the process (the probes below: the layers' shapes, decoding's LM head)."""
    if key not in _SPEEDUPS:

        def timed(work: Callable[[], Any]) -> Callable[[], float]:
            def run() -> float:
                start = time.perf_counter()
                work()
                return time.perf_counter() - start

            return run

        _SPEEDUPS[key] = time_ratio(timed(torch_work), timed(onednn_work), PROBE_RUNS)
    return _SPEEDUPS[key]


# decoding's LM head: a few rows against the whole vocabulary, a product bound by reading the head's weights
# (SmolLM2: 113 MB in float32). MKL's sgemm is slow at that shape: one AMD EPYC core (AVX2), 8 rows,
# F.linear 23.4 ms vs oneDNN 16.1 ms (4 rows: 20.1 vs 13.7, 16 rows: 31.6 vs 22.2), while on the same core
# oneDNN lost to MKL on the layers' 512-row training shapes (0.93-0.97x): the head's choice is its own.
HEAD_PROBE_ROWS = 8


def decode_head_fn(head: torch.Tensor) -> Callable[..., torch.Tensor]:
    """The faster of ``F.linear`` and oneDNN for a decode step's LM head ``head`` ``[V, H]`` (float32 CPU
    weights only; anything else gets ``F.linear``), measured once per shape and thread count (~0.2 s for
    SmolLM2's head; picked when oneDNN is at least ``MIN_SPEEDUP`` faster) and logged."""
    if head.dtype is not torch.float32 or head.device.type != "cpu" or head.shape[1] < MIN_WIDTH:
        return F.linear
    if not onednn_available():
        return F.linear
    key = ("head", tuple(head.shape), torch.get_num_threads())
    fresh = key not in _SPEEDUPS
    weight = head.detach()
    x = torch.randn(HEAD_PROBE_ROWS, weight.shape[1], generator=torch.Generator().manual_seed(0))
    speedup = _cached_ratio(key, lambda: F.linear(x, weight), lambda: _dnn_mm(x, weight))
    if fresh:
        logger.info(
            "decode LM head %s: oneDNN %.2fx torch's at %d rows, %d thread(s)",
            "-> onednn" if speedup >= MIN_SPEEDUP else "stays on torch",
            speedup,
            HEAD_PROBE_ROWS,
            key[2],
        )
    return onednn_linear if speedup >= MIN_SPEEDUP else F.linear


def onednn_speedup(model: torch.nn.Module, threads: int) -> float | None:
    """Measured time ratio torch / oneDNN of the products ``OneDnnLinear`` moves to oneDNN (forward and
    input gradient) at ``model``'s layer shapes (hidden → intermediate, intermediate → hidden,
    hidden → hidden) over ``PROBE_TOKENS`` rows, both ways interleaved, best of ``PROBE_RUNS`` (~0.5 s for
    SmolLM2). None where the model has no such config, is narrower than ``MIN_WIDTH`` (its per-call
    overheads, not the GEMM library, decide; a timing there would only pick at random) or oneDNN is
    missing. Cached per shape and thread count for the process."""
    cfg = getattr(model, "config", None)
    hidden, inner = getattr(cfg, "hidden_size", None), getattr(cfg, "intermediate_size", None)
    if not (isinstance(hidden, int) and isinstance(inner, int)) or hidden < MIN_WIDTH or not onednn_available():
        return None
    key = ("layers", hidden, inner, threads)
    if key in _SPEEDUPS:
        return _SPEEDUPS[key]
    gen = torch.Generator().manual_seed(0)
    mats = []
    for fan_in, fan_out in ((hidden, inner), (inner, hidden), (hidden, hidden)):
        x = torch.randn(PROBE_TOKENS, fan_in, generator=gen)
        mats.append((x, torch.randn(fan_out, fan_in, generator=gen), torch.randn(PROBE_TOKENS, fan_out, generator=gen)))

    def run(backend: str) -> None:
        for x, w, g in mats:
            if backend == "onednn":
                _dnn_mm(x, w), _dnn_mm(g, w.t().contiguous())
            else:
                torch.mm(x, w.t()), torch.mm(g, w)

    return _cached_ratio(key, lambda: run("torch"), lambda: run("onednn"))


def resolve_fp32_linear(choice: str, precision: str, device: str | torch.device, model: torch.nn.Module) -> str:
    """``torch`` or ``onednn`` for ``choice`` (``engine.fp32_linear``) given the resolved ``precision``;
    ``auto`` is decided by ``onednn_speedup`` on the model (logged)."""
    if choice not in FP32_LINEARS:
        raise ValueError(f"engine.fp32_linear={choice!r}; valid: {', '.join(FP32_LINEARS)}")
    cpu_fp32 = device_type(device) == "cpu" and precision == "fp32"
    if choice == "onednn" and not onednn_available():
        raise ValueError(
            "engine.fp32_linear=onednn but this torch build has no oneDNN linear kernel "
            "(torch.backends.mkldnn.is_available() is False); use engine.fp32_linear=auto or torch"
        )
    if choice != "auto":
        if choice == "onednn" and not cpu_fp32:
            logger.info("fp32_linear onednn has no effect with precision %s on %s", precision, device)
        return choice
    if not cpu_fp32:
        return "torch"
    threads = torch.get_num_threads()
    speedup = onednn_speedup(model, threads)
    chosen = "onednn" if speedup is not None and speedup >= MIN_SPEEDUP else "torch"
    if speedup is None:
        logger.info("fp32_linear auto -> torch (not timed: the model is narrower than %d, or no oneDNN)", MIN_WIDTH)
    else:
        logger.info(
            "fp32_linear auto -> %s (oneDNN %.2fx torch's on the model's layer shapes, %d rows, forward and "
            "input gradient, %d thread(s))",
            chosen,
            speedup,
            PROBE_TOKENS,
            threads,
        )
    return chosen
