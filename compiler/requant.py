"""Requantization in the accelerator's integer ALU: choosing multipliers and shifts.

A real per-channel factor ``M`` (e.g. ``s_in * s_w / s_out``) is applied to an accumulator ``x`` as

    ((x + r1) >> s1) * m + r2 >> s2        r1 = 2**(s1-1), r2 = 2**(s2-1) (round half up), m = round(M * 2**(s1+s2))

The pre-shift ``s1`` exists because ``x * m`` must fit the accumulator: :func:`solve_rescale` searches
the shifts for the smallest worst-case error given a bound on ``|x|`` (for a convolution, the exact worst
case ``sum |w| * 2**(inp_width-1) + |bias|``, so no input can make it wrap) and proves the result with
interval arithmetic. :func:`build_epilogue` assembles a layer's whole epilogue: bias, rescale, an
optional residual input rescaled to a common fixed point with ``frac`` extra bits, an optional
per-channel shift, and the activation's clamps.

The ALU's RQ op does a whole rescale in one pass, ``(x * m + 2**(s-1)) >> s`` with the product exact and
``m`` and ``s`` per channel (:func:`solve_rq`), and takes a ReLU with it. Where it is available and at least
as precise as the shift-multiply-shift form (:data:`RQ_TOLERANCE`), :func:`build_epilogue` uses it: a plain
layer's epilogue becomes the bias and one RQ instead of five or six passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from weft.core.epilogue import EpilogueOverflow, Step, bounds
from weft.isa.arith import rq_layout, rq_pack

__all__ = ["RQ_TOLERANCE", "Rescale", "build_epilogue", "clamp_steps", "rescale_steps", "solve_rescale", "solve_rq"]

#: Extra fractional bits tried (largest first) when a residual or a shift is added before rounding.
MAX_FRAC = 8
#: The same for a precise epilogue (its multipliers are vectors, so they have room for the extra bits).
PRECISE_FRAC = 16
#: RQ's worst-case error (output units, before the final rounding) accepted even where the multi-pass form
#: would be more precise: far below the half unit of the final rounding, and below the 1e-3 to which a
#: precise epilogue matches a model's float rounding.
RQ_TOLERANCE = 1e-3
#: Below this many output pixels per channel a form of immediates only beats RQ's one pass: RQ's operands are
#: a vector, which costs a load of acc rows per tile, where immediates cost nothing beyond their passes.
RQ_MIN_PIXELS = 32
#: The worst-case error (output units, before the final rounding) accepted for a residual the GEMM adds
#: (``residual_scale``): the layer's sum is held in units of 1/c of the residual's, so it rounds there.
RESIDUAL_GEMM_ERROR = 1 / 64


@dataclass(frozen=True)
class Rescale:
    """x -> ((x + r1) >> pre_shift) * multiplier + r2 >> post_shift, approximating x * M * 2**frac."""

    pre_shift: int
    multiplier: np.ndarray
    post_shift: int
    frac: int
    error: float  # worst-case error bound, in output units (excluding the final half-unit rounding)


def solve_rescale(real: np.ndarray, bound: np.ndarray, acc_width: int, out_width: int, frac: int = 0,
                  imm_max: int | None = None) -> Rescale:
    """The shifts and per-channel multipliers with the smallest worst-case error that never leave the
    acc_width range for ``|x| <= bound`` (per channel). Raises EpilogueOverflow when none exists.

    With `imm_max`, the multiplier and both rounding constants stay within it, so a factor shared by all
    channels costs ALU immediates only (at 15 bits the precision lost is far below an output unit).
    """
    real = np.asarray(real, dtype=np.float64).reshape(-1)
    bound = np.broadcast_to(np.asarray(bound, dtype=np.int64), real.shape)
    top = (1 << (acc_width - 1)) - 1
    mags = np.abs(real)
    live = mags > 0
    if not live.any():
        return Rescale(0, np.zeros(real.shape, np.int64), 0, frac, 0.0)
    sat = (1 << (out_width - 1)) / np.where(live, mags, 1.0)
    reach = bound.astype(np.float64) if frac else np.minimum(bound, sat)  # inputs that matter before clamping
    best: Rescale | None = None
    max_shift = acc_width - 2 if imm_max is None else min(acc_width - 2, imm_max.bit_length())
    for s1 in range(max_shift + 1):
        r1 = (1 << (s1 - 1)) if s1 else 0
        if int(bound.max()) + r1 > top:
            break
        b1 = ((bound + r1) >> s1) + 1
        m_cap = top // b1[live] if imm_max is None else np.minimum(top // b1[live], imm_max)
        cap = np.min(m_cap / (mags[live] * 2.0 ** (s1 + frac)))
        start = int(np.clip(np.floor(np.log2(cap)) if cap > 0 else 0, 0, max_shift))
        for s2 in range(start, -1, -1):
            r2 = (1 << (s2 - 1)) if s2 else 0
            m = np.round(real * 2.0 ** (s1 + s2 + frac)).astype(np.int64)
            if np.all(np.abs(m) * b1 + r2 <= top) and (imm_max is None or np.abs(m).max() <= imm_max):
                break
        else:
            continue
        pre = (2.0 ** (s1 - 1) if s1 else 0.0) * mags
        mult = np.abs(m / 2.0 ** (s1 + s2 + frac) - real) * reach
        error = float(np.max((pre + mult)[live]))
        if best is None or error < best.error * (1 - 1e-9):
            best = Rescale(s1, m, s2, frac, error)
    if best is None:
        raise EpilogueOverflow(f"no shift keeps |x| <= {int(bound.max())} times the multiplier within "
                               f"{acc_width} bits")
    return best


def solve_rq(real: np.ndarray, bound: np.ndarray, acc_width: int, out_width: int, frac: int = 0,
             relu: bool = False, reach: np.ndarray | None = None) -> tuple[np.ndarray, float] | None:
    """RQ operands approximating ``x * real * 2**frac`` (per channel, ``|x| <= bound``) and their worst-case
    error in units of ``real`` (as :attr:`Rescale.error`) for ``|x|`` up to `reach` (default: the whole bound
    with a `frac`, else up to where the output saturates), or None where a factor is too large for the
    multiplier field.
    Each channel takes the largest shift that keeps its multiplier in the field, so every
    multiplier uses the field's full precision."""
    real = np.asarray(real, dtype=np.float64).reshape(-1)
    bound = np.broadcast_to(np.asarray(bound, dtype=np.int64), real.shape)
    mul_bits, shift_bits = rq_layout(acc_width)
    m_max = (1 << (mul_bits - 1)) - 1
    s_max = min((1 << shift_bits) - 1, acc_width + mul_bits - 1)
    scaled = real * 2.0 ** frac
    mags = np.abs(scaled)
    live = mags > 0
    if np.any(mags > m_max):
        return None
    s = np.zeros(real.shape, np.int64)
    s[live] = np.clip(np.floor(np.log2(m_max / mags[live])), 0, s_max).astype(np.int64)
    m = np.round(scaled * 2.0 ** s).astype(np.int64)
    over = np.abs(m) > m_max  # rounding up past the field: one bit less
    s[over] -= 1
    m[over] = np.round(scaled[over] * 2.0 ** s[over]).astype(np.int64)
    if np.any(s < 0) or np.any(np.abs(m) > m_max):
        return None
    if reach is None:
        sat = (1 << (out_width - 1)) / np.where(live, np.abs(real), 1.0)
        reach = bound.astype(np.float64) if frac else np.minimum(bound, sat)
    error = np.abs(m / 2.0 ** (s + frac) - real) * reach
    return rq_pack(m, s, relu, acc_width).astype(np.int32), float(np.max(error[live])) if live.any() else 0.0


def _uniform_or_vec(base: str, values: np.ndarray, imm_range: tuple[int, int]) -> Step:
    """``base_imm`` when every channel has the same value and it fits the immediate, else ``base_vec``."""
    first = int(values.reshape(-1)[0])
    if np.all(values == first) and imm_range[0] <= first <= imm_range[1]:
        return (f"{base}_imm", first)
    return (f"{base}_vec", values.astype(np.int32 if values.size == 0 or np.abs(values).max() < 2**31 else np.int64))


def rescale_steps(rs: Rescale, channels: int, imm_range: tuple[int, int], *, pre_round: bool = True) -> list[Step]:
    """The ALU steps of a rescale; ``pre_round=False`` when r1 is already folded into a bias."""
    steps: list[Step] = []
    if rs.pre_shift:
        if pre_round:
            steps.append(_uniform_or_vec("add", np.full(channels, 1 << (rs.pre_shift - 1)), imm_range))
        steps.append(("shr_imm", rs.pre_shift))
    steps.append(_uniform_or_vec("mul", rs.multiplier, imm_range))
    if rs.post_shift:
        steps.append(_uniform_or_vec("add", np.full(channels, 1 << (rs.post_shift - 1)), imm_range))
        steps.append(("shr_imm", rs.post_shift))
    return steps


def clamp_steps(lo: int, hi: int, channels: int, out_width: int) -> list[Step]:
    """Clamps to [lo, hi] beyond what the saturating narrowing does. Bounds that would move a zero
    (a padded channel) become vectors, which the padding makes zero there."""
    steps: list[Step] = []
    if lo > -(1 << (out_width - 1)):
        steps.append(("max_imm", lo) if lo <= 0 else ("max_vec", np.full(channels, lo, np.int32)))
    if hi < (1 << (out_width - 1)) - 1:
        steps.append(("min_imm", hi) if hi >= 0 else ("min_vec", np.full(channels, hi, np.int32)))
    return steps


def build_epilogue(*, real: np.ndarray, bound: np.ndarray, acc_width: int, out_width: int,
                   imm_range: tuple[int, int], lo: int, hi: int, bias: np.ndarray | None = None,
                   shift: np.ndarray | None = None, residual_real: np.ndarray | None = None,
                   precise: bool = False, pixels: int | None = None,
                   residual_scale: int | None = None) -> tuple[Step, ...]:
    """The epilogue of one layer, proven not to overflow for ``|acc| <= bound`` and any residual.

    ``acc`` is multiplied by ``real`` (per channel) into output units after ``bias`` (acc units) is
    added; ``residual_real`` scales the int residual input into output units; ``shift`` (output units)
    is added before the final rounding; the result is clamped to [lo, hi].

    ``precise`` trades ALU work for rounding fidelity, for models that bring their own int8 arithmetic
    (QDQ): multipliers may be vectors wider than an immediate, the accumulator is clamped first when that
    leaves room for a wider multiplier, and a residual sum keeps up to ``PRECISE_FRAC`` fractional bits.
    The default keeps every error far below an output unit; precise also makes ties within ~1e-3 of a
    unit round as the model's float arithmetic does in all but a few in a thousand values.

    ``pixels`` (output pixels per channel, where known) keeps a form of immediates only for small layers
    (:data:`RQ_MIN_PIXELS`), where RQ's vector load would cost more than the passes it saves.

    ``residual_scale`` (c, the largest weight) lets a convolution's residual be multiplied by c alone, which
    its GEMM can do while it adds the residual (:func:`weft.compiler.backend.alu.residual_scale`): the sum is
    rescaled to units of 1/c of the residual's, the residual added times c, and one RQ takes the total to the
    output. Used where its error stays within :data:`RESIDUAL_GEMM_ERROR` and the epilogue is not precise.
    """
    real = np.asarray(real, dtype=np.float64).reshape(-1)
    channels = real.size
    bound = np.broadcast_to(np.asarray(bound, dtype=np.int64), (channels,))
    bias_i = np.zeros(channels, np.int64) if bias is None else np.asarray(bias, np.int64)
    x_bound = bound + np.abs(bias_i)
    if shift is None and residual_real is None:
        rq = _try(_direct_rq, real, bound, bias, bias_i, x_bound, acc_width, out_width, imm_range, lo, hi)
        if precise:
            old = _try(_most_precise, real, bound, bias, bias_i, x_bound, acc_width, out_width, imm_range, lo, hi)
        else:
            old = (_try(_direct, real, bound, bias, bias_i, x_bound, acc_width, out_width, imm_range, lo, hi)
                   or _try(_saturating, real, bound, bias, bias_i, x_bound, acc_width, out_width, imm_range, lo, hi))
        best = _pick(rq, old, pixels)
        if best is None:
            raise EpilogueOverflow(f"no shift keeps |x| <= {int(x_bound.max())} times the multiplier within "
                                   f"{acc_width} bits")
        return best[0]
    res_bound = 1 << (out_width - 1)
    if residual_real is not None and shift is None and residual_scale and not precise:
        by_gemm = _try(_residual_by_gemm, real, bound, bias, bias_i, x_bound, residual_real, residual_scale,
                       acc_width, out_width, imm_range, lo, hi)
        if by_gemm is not None and by_gemm[1] <= RESIDUAL_GEMM_ERROR:
            return by_gemm[0]
    failure: Exception | None = None
    for frac in range(PRECISE_FRAC if precise else MAX_FRAC, -1, -1):
        try:
            uniform = bool(np.all(real == real[0])) and not precise
            rs = solve_rescale(real, x_bound, acc_width, out_width, frac, imm_range[1] if uniform else None)
            steps: list[Step] = []
            r1 = (1 << (rs.pre_shift - 1)) if rs.pre_shift else 0
            if bias is not None and (np.any(bias_i) or r1):
                steps.append(_uniform_or_vec("add", bias_i + r1, imm_range))
                steps += rescale_steps(rs, channels, imm_range, pre_round=False)
            else:
                steps += rescale_steps(rs, channels, imm_range)
            error = rs.error
            r_real = None
            if residual_real is not None:
                r_real = np.broadcast_to(np.asarray(residual_real, np.float64), (channels,))
                r_uniform = bool(np.all(r_real == r_real[0])) and not precise
                rr = solve_rescale(r_real, np.full(channels, res_bound), acc_width, out_width, frac,
                                   imm_range[1] if r_uniform else None)
                steps.append(("residual", tuple(rescale_steps(rr, channels, imm_range))))
                error += rr.error
            add = _final_add(frac, shift, channels)
            if np.any(add):
                steps.append(_uniform_or_vec("add", add, imm_range))
            if frac:
                steps.append(("shr_imm", frac))
            steps += clamp_steps(lo, hi, channels, out_width)
            residual_range = (np.full(channels, -res_bound), np.full(channels, res_bound - 1))
            bounds(steps, -bound, bound, acc_width, residual=residual_range)
            rq = _try(_fixed_point_rq, real, bound, bias, bias_i, x_bound, r_real, shift, frac, acc_width,
                      out_width, imm_range, lo, hi)
            picked = _pick(rq, (tuple(steps), error), pixels)
            assert picked is not None
            return picked[0]
        except EpilogueOverflow as err:
            failure = err
    raise EpilogueOverflow(str(failure))


Form = tuple[tuple[Step, ...], float]


def _try(form: object, *args: object) -> Form | None:
    """`form`'s steps and error, None where it overflows the accumulator (or its fields)."""
    try:
        return form(*args)  # type: ignore[operator]
    except EpilogueOverflow:
        return None


def _pick(rq: Form | None, old: Form | None, pixels: int | None) -> Form | None:
    """RQ's form where it is within :data:`RQ_TOLERANCE` or no less precise than the other (it takes fewer
    passes), else the other; the other where it needs no vector and the layer is small."""
    if old is not None and pixels is not None and pixels < RQ_MIN_PIXELS \
            and all(kind.endswith("_imm") for kind, _ in old[0]):
        return old
    if rq is not None and (old is None or rq[1] <= max(old[1], RQ_TOLERANCE)):
        return rq
    return old


def _final_add(frac: int, shift: np.ndarray | None, channels: int) -> np.ndarray:
    """What a fixed-point epilogue adds before dropping its `frac` bits: the shift, and the rounding
    constant unless RQ's rounding does it."""
    add = np.full(channels, (1 << (frac - 1)) if frac else 0, np.int64)
    if shift is not None:
        add = add + np.round(np.asarray(shift, np.float64) * 2.0 ** frac).astype(np.int64)
    return add


def _relu_split(lo: int, out_width: int) -> tuple[bool, int]:
    """Whether RQ's ReLU flag does the lower clamp, and the lower clamp left for clamp_steps."""
    if lo == 0:
        return True, -(1 << (out_width - 1))
    return False, lo


def _bias_then_rq(bias: np.ndarray | None, bias_i: np.ndarray, imm_range: tuple[int, int],
                  solved: tuple[np.ndarray, float] | None) -> list[Step]:
    """The bias (where there is one) and the RQ of `solved` (:func:`solve_rq`; None: it did not fit)."""
    if solved is None:
        raise EpilogueOverflow("a factor is too large for RQ's multiplier")
    steps: list[Step] = []
    if bias is not None and np.any(bias_i):
        steps.append(_uniform_or_vec("add", bias_i, imm_range))
    steps.append(("rq_vec", solved[0]))
    return steps


def _direct_rq(real: np.ndarray, bound: np.ndarray, bias: np.ndarray | None, bias_i: np.ndarray,
               x_bound: np.ndarray, acc_width: int, out_width: int, imm_range: tuple[int, int], lo: int,
               hi: int) -> Form:
    """bias, one RQ (with the ReLU where the lower clamp is 0), the clamps left."""
    relu, lo_left = _relu_split(lo, out_width)
    solved = solve_rq(real, x_bound, acc_width, out_width, 0, relu)
    steps = _bias_then_rq(bias, bias_i, imm_range, solved)
    steps += clamp_steps(lo_left, hi, real.size, out_width)
    bounds(steps, -bound, bound, acc_width)
    return tuple(steps), solved[1]


def _residual_by_gemm(real: np.ndarray, bound: np.ndarray, bias: np.ndarray | None, bias_i: np.ndarray,
                      x_bound: np.ndarray, residual_real: np.ndarray, c: int, acc_width: int, out_width: int,
                      imm_range: tuple[int, int], lo: int, hi: int) -> Form:
    """bias; RQ to units of 1/c of the residual's; the residual times c; RQ to the output with the ReLU.
    The error counts the first RQ's rounding (half a unit of 1/c residual units) and both multipliers'."""
    channels = real.size
    r_real = np.broadcast_to(np.asarray(residual_real, np.float64), (channels,))
    if np.any(r_real == 0):
        raise EpilogueOverflow("a residual factor of 0")
    res_bound = 1 << (out_width - 1)
    relu, lo_left = _relu_split(lo, out_width)
    target = real / r_real * c
    # Errors count where the output does not saturate: the sum within (1 + |r_real|) * 2**(out_width-1) output
    # units (beyond it, whatever the residual adds, the output is clamped)
    per_unit = np.abs(r_real) / abs(c)  # output units per unit of the sum (1/c of the residual's)
    live = np.abs(real) > 0
    sat = res_bound * (1 + np.abs(r_real)) / np.where(live, np.abs(real), 1.0) + 1
    main = solve_rq(target, x_bound, acc_width, out_width, reach=np.minimum(x_bound, sat))
    sum_bound = np.ceil(x_bound * np.abs(target)).astype(np.int64) + 1 + abs(c) * res_bound
    final = solve_rq(r_real / c, sum_bound, acc_width, out_width, 0, relu,
                     reach=res_bound * (1 + np.abs(r_real)) / per_unit)
    if final is None:
        raise EpilogueOverflow("a factor is too large for RQ's multiplier")
    steps = _bias_then_rq(bias, bias_i, imm_range, main)
    steps += [("residual", (("mul_imm", int(c)),)), ("rq_vec", final[0])]
    steps += clamp_steps(lo_left, hi, channels, out_width)
    residual_range = (np.full(channels, -res_bound), np.full(channels, res_bound - 1))
    bounds(steps, -bound, bound, acc_width, residual=residual_range)
    # main's error is in units of the sum; its rounding adds half of one
    top = float(np.max(per_unit))
    return tuple(steps), (main[1] + 0.5) * top + final[1]  # type: ignore[index]


def _fixed_point_rq(real: np.ndarray, bound: np.ndarray, bias: np.ndarray | None, bias_i: np.ndarray,
                    x_bound: np.ndarray, residual_real: np.ndarray | None, shift: np.ndarray | None, frac: int,
                    acc_width: int, out_width: int, imm_range: tuple[int, int], lo: int, hi: int) -> Form:
    """With a residual or a shift: the accumulator and the residual each rescaled by one RQ to `frac`
    fractional bits, added, then one RQ by 1 drops the bits with rounding (and takes the ReLU)."""
    channels = real.size
    res_bound = 1 << (out_width - 1)
    relu, lo_left = _relu_split(lo, out_width)
    main = solve_rq(real, x_bound, acc_width, out_width, frac)
    steps = _bias_then_rq(bias, bias_i, imm_range, main)
    error = main[1]  # type: ignore[index]
    if residual_real is not None:
        res = solve_rq(residual_real, np.full(channels, res_bound), acc_width, out_width, frac)
        if res is None:
            raise EpilogueOverflow("a residual factor is too large for RQ's multiplier")
        steps.append(("residual", (("rq_vec", res[0]),)))
        error += res[1]
    shifted = _final_add(frac, shift, channels) - _final_add(frac, None, channels)
    if np.any(shifted):
        steps.append(_uniform_or_vec("add", shifted, imm_range))
    if frac or relu:
        steps.append(("rq_vec", rq_pack(np.ones(channels, np.int64), frac, relu, acc_width).astype(np.int32)))
    steps += clamp_steps(lo_left if frac or relu else lo, hi, channels, out_width)
    residual_range = (np.full(channels, -res_bound), np.full(channels, res_bound - 1))
    bounds(steps, -bound, bound, acc_width, residual=residual_range)
    return tuple(steps), error


def _most_precise(real: np.ndarray, bound: np.ndarray, bias: np.ndarray | None, bias_i: np.ndarray,
                  x_bound: np.ndarray, acc_width: int, out_width: int, imm_range: tuple[int, int], lo: int,
                  hi: int) -> Form:
    """Of the direct and the clamp-first epilogue, with multipliers free to be vectors, the one with the
    smaller worst-case rounding error."""
    candidates: list[Form] = []
    for form in (_direct, _saturating):
        try:
            candidates.append(form(real, bound, bias, bias_i, x_bound, acc_width, out_width, imm_range, lo, hi,
                                   vector=True))
        except EpilogueOverflow:
            continue
    if not candidates:
        raise EpilogueOverflow(f"no shift keeps |x| <= {int(x_bound.max())} times the multiplier within "
                               f"{acc_width} bits")
    return min(candidates, key=lambda c: c[1])


def _direct(real: np.ndarray, bound: np.ndarray, bias: np.ndarray | None, bias_i: np.ndarray, x_bound: np.ndarray,
            acc_width: int, out_width: int, imm_range: tuple[int, int], lo: int, hi: int, *, vector: bool = False
            ) -> tuple[tuple[Step, ...], float]:
    """bias, rescale, clamps: the pre-shift's rounding constant folds into the bias. Returns the steps and
    their worst-case error; `vector` lets a shared multiplier outgrow the immediate."""
    channels = real.size
    uniform = bool(np.all(real == real[0])) and not vector
    rs = solve_rescale(real, x_bound, acc_width, out_width, 0, imm_range[1] if uniform else None)
    r1 = (1 << (rs.pre_shift - 1)) if rs.pre_shift else 0
    steps: list[Step] = []
    if bias is not None and (np.any(bias_i) or r1):
        steps.append(_uniform_or_vec("add", bias_i + r1, imm_range))
        steps += rescale_steps(rs, channels, imm_range, pre_round=False)
    else:
        steps += rescale_steps(rs, channels, imm_range)
    steps += clamp_steps(lo, hi, channels, out_width)
    bounds(steps, -bound, bound, acc_width)
    return tuple(steps), rs.error


def _saturating(real: np.ndarray, bound: np.ndarray, bias: np.ndarray | None, bias_i: np.ndarray,
                x_bound: np.ndarray, acc_width: int, out_width: int, imm_range: tuple[int, int], lo: int, hi: int,
                *, vector: bool = False) -> tuple[tuple[Step, ...], float]:
    """For factors too large to rescale the whole accumulator range: clamp the accumulator first to
    [below, above], beyond which the output is already clamped to lo or hi (the mapping is monotonic, so
    this is exact), then rescale the small range that is left. The clamp is as tight as the output range
    allows (with ReLU, lo = 0, nothing below -1 matters): the smaller the range, the wider the multiplier."""
    channels = real.size
    safe = np.where(real != 0, real, 1.0)
    # the accumulators that land on lo and hi (in either order: real may be negative), one step further out,
    # so the rescale's error (far below half an output unit) cannot bring them back inside
    at_lo, at_hi = lo / safe, hi / safe
    below = np.floor(np.minimum(at_lo, at_hi)) - 1
    above = np.ceil(np.maximum(at_lo, at_hi)) + 1
    below = np.where(real != 0, np.maximum(below, -x_bound), 0).astype(np.int64)
    above = np.where(real != 0, np.minimum(above, x_bound), 0).astype(np.int64)
    limit = np.maximum(np.abs(below), np.abs(above))
    steps: list[Step] = []
    if np.any(bias_i):
        steps.append(_uniform_or_vec("add", bias_i, imm_range))
    steps += [_uniform_or_vec("max", below, imm_range), _uniform_or_vec("min", above, imm_range)]
    uniform = bool(np.all(real == real[0])) and not vector
    rs = solve_rescale(real, limit, acc_width, out_width, 0, imm_range[1] if uniform else None)
    steps += rescale_steps(rs, channels, imm_range)
    steps += clamp_steps(lo, hi, channels, out_width)
    bounds(steps, -bound, bound, acc_width)
    return tuple(steps), rs.error
