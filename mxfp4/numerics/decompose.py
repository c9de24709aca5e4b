r"""The exact three-way split of block-quantization error, and its order-free attribution.

``decompose(x, fmt, axis, scale_rule, form=...)`` returns the quantized tensor and the three
components (scale bias, deadzone truncation, grid noise) with ``MX(x) - x = e_scale + e_dead + e_grid``
elementwise, the Shapley attribution of the error energy and the statistics per tensor. Two exact
forms (``FORMS``): ``canonical`` (ideal-scale deadzone and grid; scale bias all the stored scale adds)
and ``gain`` (the deadzone MXFP4 flushes at the stored scale; scale bias the per-block gain, the
least-squares projection onto x of the scale-induced error; grid noise the rest). The definitions and
the proofs are in docs/decomposition.md.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field

import torch

from . import fused_cpu
from .formats import BlockFormat, round_to_grid
from .reference import check_input, from_blocks, nvfp4_tensor_scale, quantize_blocks, to_blocks

# The pooled shares that summaries (cell metrics, probe logs) report.
SUMMARY_KEYS = ("share_scale", "share_dead", "share_grid", "cross_share", "shapley_share_scale",
                "shapley_share_dead", "shapley_share_grid", "deadzone_fraction", "saturation_fraction")

COMPONENTS = ("scale", "dead", "grid")
FORMS = ("canonical", "gain")
PAIRS = (("scale", "dead"), ("scale", "grid"), ("dead", "grid"))


def check_form(form: str) -> str:
    if form not in FORMS:
        raise ValueError(f"decomposition form {form!r}; accepted: {', '.join(FORMS)}")
    return form


@dataclass
class Decomposition:
    """Component tensors (float64, the shape of the input) and per-tensor statistics: what ``decompose``
    returns, with ``quantized - x == e_scale + e_dead + e_grid`` exactly.

    Attributes:
        x: the input.
        quantized: its fake-quantized values.
        e_scale, e_dead, e_grid: the scale-bias, deadzone and grid-noise components of the error.
        dead: the elements rounded to zero (the deadzone).
        saturated: the elements clipped at the grid's maximum.
        stats: energies, shares and counts (``docs/decomposition.md``).
    """

    x: torch.Tensor
    quantized: torch.Tensor
    e_scale: torch.Tensor
    e_dead: torch.Tensor
    e_grid: torch.Tensor
    dead: torch.Tensor
    saturated: torch.Tensor
    stats: dict = field(default_factory=dict)

    @property
    def error(self) -> torch.Tensor:
        return self.quantized - self.x


def _corner_energies(x, grid_values, sigma):
    """v(D, G) for the four (deadzone, grid) corners at one scale sigma."""
    kept = grid_values != 0
    on_grid = sigma * grid_values
    return {
        (False, False): 0.0,
        (True, False): float(x[~kept].pow(2).sum()),
        (False, True): float((on_grid - x)[kept].pow(2).sum()),
        (True, True): float((on_grid - x).pow(2).sum()),
    }


def shapley_values(v: dict[frozenset, float], players: tuple[str, ...] = COMPONENTS) -> dict[str, float]:
    """Shapley values of a game given on every coalition (``v[frozenset()]`` the empty one); they sum
    to v(all) - v(empty). Used for the error energy here and for the pathway matrix's outcomes."""
    n = len(players)
    values = {}
    for player in players:
        others = [p for p in players if p != player]
        total = 0.0
        for size in range(n):
            weight = math.factorial(size) * math.factorial(n - size - 1) / math.factorial(n)
            for subset in itertools.combinations(others, size):
                t = frozenset(subset)
                total += weight * (v[t | {player}] - v[t])
        values[player] = total
    return values


def interaction(v: dict[frozenset, float], players: tuple[str, ...] = COMPONENTS) -> float:
    """What the single players do not explain: v(all) - v(empty) - sum_p (v({p}) - v(empty))."""
    empty = v[frozenset()]
    return v[frozenset(players)] - empty - sum(v[frozenset({p})] - empty for p in players)


def shapley(x, ideal_grid, s_star, stored_grid, s) -> dict[str, float]:
    """Shapley values of the error energy over the players scale, dead, grid."""
    at_ideal = _corner_energies(x, ideal_grid, s_star)
    at_stored = _corner_energies(x, stored_grid, s)
    coalitions = [frozenset(c for c, on in zip(COMPONENTS, bits) if on) for bits in itertools.product((0, 1), repeat=3)]
    return shapley_values(
        {t: (at_stored if "scale" in t else at_ideal)[("dead" in t, "grid" in t)] for t in coalitions})


def vector_shapley(components: dict[str, torch.Tensor]) -> dict[str, float]:
    """Shapley values of the game v(T) = ||sum of the components in T||^2: for a quadratic game each
    player's value is <e_c, e> (its own energy plus half of each cross term it takes part in), and
    they sum to ||e||^2 exactly. The gain form's attribution (its components need no corner
    quantizers)."""
    total = sum(components.values())
    return {c: float((components[c] * total).sum()) for c in COMPONENTS}


def _share(part: float, total: float) -> float:
    """part / total, defined as 0 for an error-free tensor (total == 0)."""
    return part / total if total > 0 else 0.0


def _block_components(x, fmt: BlockFormat, axis: int, rule, block_quantizer=None, dtype=torch.float64,
                      form: str = "canonical"):
    """The blocks of x (in ``dtype``) and, per block, the stored and ideal quantizations and the three
    error components of ``form`` (see the module docstring), all in ``dtype``."""
    elem = fmt.element
    blocks32 = to_blocks(x, axis, fmt.block_size)
    if block_quantizer is None:
        tensor_scale = nvfp4_tensor_scale(x, fmt) if fmt.tensor_scale else None
        stored_grid, _, scale = quantize_blocks(blocks32, fmt, rule, tensor_scale)
    else:
        stored_grid, scale = block_quantizer(blocks32)
    blocks = blocks32.to(dtype)
    stored_grid = stored_grid.to(dtype)
    s = scale.to(dtype).unsqueeze(-1)
    quantized = stored_grid * s
    amax = blocks.abs().amax(-1, keepdim=True)
    nonzero = amax > 0
    safe_amax = torch.where(nonzero, amax, torch.ones_like(amax))
    ideal_grid = torch.where(nonzero, round_to_grid(blocks * elem.max_value / safe_amax, elem), 0.0)
    x_grid = ideal_grid * amax / elem.max_value
    common = {"quantized": quantized, "stored_grid": stored_grid, "s": s, "ideal_grid": ideal_grid,
              "s_star": amax / elem.max_value}
    if check_form(form) == "canonical":
        dead = ideal_grid == 0
        return blocks, {**common, "dead": dead, "e_dead": torch.where(dead, -blocks, 0.0),
                        "e_grid": torch.where(dead, 0.0, x_grid - blocks), "e_scale": quantized - x_grid}
    # gain form: the stored-scale deadzone; the scale-induced error of the kept elements projected onto x
    dead = stored_grid == 0
    kept_x = torch.where(dead, 0.0, blocks)
    scale_induced = torch.where(dead, 0.0, quantized - x_grid)
    kept_sq, cross = kept_x.pow(2), scale_induced * kept_x
    norm = kept_sq.sum(-1, keepdim=True)
    projection = cross.sum(-1, keepdim=True) / norm.clamp(min=torch.finfo(dtype).tiny)
    gain = torch.where(norm > 0, projection, 0.0)
    e_scale = gain * kept_x
    return blocks, {**common, "dead": dead, "gain": gain, "e_dead": torch.where(dead, -blocks, 0.0),
                    "e_scale": e_scale, "e_grid": torch.where(dead, 0.0, quantized - blocks - e_scale),
                    "kept_sq": kept_sq, "cross": cross}


_PART_NAMES = (("scale", "e_scale"), ("dead", "e_dead"), ("grid", "e_grid"), ("quantized", "quantized"))


def error_components(x: torch.Tensor, fmt: str | BlockFormat = "mxfp4", axis: int = -1, scale_rule: str | None = None,
                     *, block_quantizer=None, dtype=torch.float64, form: str = "canonical") -> dict[str, torch.Tensor]:
    """The three error components of ``x`` (of ``form``) as tensors of x's shape in ``dtype`` (float64
    by default), keyed ``scale``, ``dead``, ``grid``, plus ``quantized`` (MX(x)): the lean path of
    ``decompose`` (no statistics, no Shapley), for injecting one component into a GEMM operand."""
    fmt, axis, rule = check_input(x, fmt, axis, scale_rule)
    _, parts = _block_components(x, fmt, axis, rule, block_quantizer, dtype, form)
    return {name: from_blocks(parts[key], x.shape, axis) for name, key in _PART_NAMES}


def fused_error_components(x: torch.Tensor, fmt: str | BlockFormat = "mxfp4", axis: int = -1,
                           scale_rule: str | None = None, *, form: str = "canonical") -> dict | None:
    """``error_components(x, ..., dtype=torch.float32)`` of a float32 CPU x from the fused kernel, its values
    and layouts bit for bit; None where x holds a NaN or an infinity. ``dispatch.error_components`` decides
    when this path applies."""
    fmt, axis, rule = check_input(x, fmt, axis, scale_rule)
    parts = _fused_components(x.detach(), fmt, axis, rule, check_form(form))
    return None if parts is None else {name: from_blocks(parts[key], x.shape, axis) for name, key in _PART_NAMES}


@functools.lru_cache(maxsize=4096)
def _reference_layout(shape: tuple, stride: tuple, fmt: BlockFormat, axis: int, rule: str, form: str) -> dict:
    """The strides of ``_block_components``' float32 tensors for an x of this shape and strides: its own
    operations run on a meta tensor (no data, the same stride rules)."""
    x = torch.empty_strided(shape, stride, dtype=torch.float32, device="meta")
    blocks, parts = _block_components(x, fmt, axis, rule, None, torch.float32, form)
    return {"blocks": (tuple(blocks.shape), blocks.stride()),
            **{k: parts[k].stride() for k in ("quantized", "e_scale", "e_dead", "e_grid", "kept_sq", "cross")
               if k in parts}}


def _fused_components(x: torch.Tensor, fmt: BlockFormat, axis: int, rule: str, form: str) -> dict | None:
    """``_block_components``' quantized tensor and components of a float32 x (no block quantizer) from the fused
    CPU kernel (``fused_cpu.components``): the same float32 operations, the gain form's two sums per block
    taken by torch on tensors laid out as the reference's (so summed in its order), every output in the
    reference's layout, so the values and the GEMMs that read them are the reference's bit for bit. None
    where x holds a non-finite element (the reference then runs)."""
    layout = _reference_layout(tuple(x.shape), x.stride(), fmt, axis, rule, form)
    shape, _ = layout["blocks"]
    flat = to_blocks(x, axis, fmt.block_size).reshape(-1, fmt.block_size).contiguous()

    def as_reference(t: torch.Tensor, key: str) -> torch.Tensor:
        return fused_cpu.laid_out(t.view(shape), layout[key])

    def sums(products: list[torch.Tensor]) -> list[torch.Tensor]:
        return [as_reference(p, k).sum(-1) for p, k in zip(products, ("kept_sq", "cross"))]

    out = fused_cpu.components(flat, fmt, rule, form, sums)
    if out is None:
        return None
    return {k: as_reference(t, k) for k, t in out.items()}


def decompose(
    x: torch.Tensor,
    fmt: str | BlockFormat = "mxfp4",
    axis: int = -1,
    scale_rule: str | None = None,
    *,
    block_quantizer=None,
    exclude: torch.Tensor | None = None,
    form: str = "canonical",
) -> Decomposition:
    """Split the quantization error of ``x`` into scale bias, deadzone truncation and grid noise, in
    the canonical or the gain form (``FORMS``; docs/decomposition.md): ``e_scale + e_dead + e_grid``
    equals ``MX(x) - x`` exactly.

    Args:
        x: a finite tensor (float32, bfloat16, float16 or float64).
        fmt: the block format (a name of ``FORMATS`` or a ``BlockFormat``).
        axis: the axis the blocks run along.
        scale_rule: the scale rule (default: the format's own; ``floor`` for MXFP4).
        block_quantizer: ``block_quantizer(blocks) -> (grid values, effective scale per block)`` in place
            of the format's own quantizer (corrections such as macro-block scaling pass theirs; the
            identity holds for any).
        exclude: a mask of elements that are not quantized (kept in high precision by a correction); they
            must be zero in ``x`` and are left out of the counts and fractions.
        form: ``canonical`` (ideal-scale deadzone and grid) or ``gain`` (stored-scale deadzone; scale bias
            the per-block gain).

    Returns:
        A ``Decomposition``: the quantized tensor, the three components in ``x``'s shape, the deadzone and
        saturation masks, and ``stats`` (energies, shares, Shapley shares, cosines, fractions).
    """
    fmt, axis, rule = check_input(x, fmt, axis, scale_rule, also=(torch.float64,))  # a correction's own dtype
    n_bad = int((~torch.isfinite(x)).sum())
    if n_bad:
        raise ValueError(f"decompose needs finite input; found {n_bad} NaN or infinite elements")
    blocks, parts = _block_components(x, fmt, axis, rule, block_quantizer, form=form)
    quantized, e_scale, e_dead, e_grid = parts["quantized"], parts["e_scale"], parts["e_dead"], parts["e_grid"]
    dead, ideal_grid, s_star = parts["dead"], parts["ideal_grid"], parts["s_star"]
    stored_grid, s = parts["stored_grid"], parts["s"]
    saturated = (blocks / s).abs() > fmt.element.max_value

    if form == "canonical":
        shap = shapley(blocks, ideal_grid, s_star, stored_grid, s)
    else:
        shap = vector_shapley({"scale": e_scale, "dead": e_dead, "grid": e_grid})

    def crop(t):
        return from_blocks(t, x.shape, axis)

    out = Decomposition(
        x=crop(blocks),
        quantized=crop(quantized),
        e_scale=crop(e_scale),
        e_dead=crop(e_dead),
        e_grid=crop(e_grid),
        dead=crop(dead),
        saturated=crop(saturated),
    )
    counted = None
    if exclude is not None:
        if exclude.shape != x.shape:
            raise ValueError(f"exclude must have the shape of x {tuple(x.shape)}, got {tuple(exclude.shape)}")
        if (x[exclude] != 0).any():
            raise ValueError("excluded elements must be zero in x (they are not quantized)")
        counted = ~exclude
        out.dead &= counted
        out.saturated &= counted
    out.stats = component_stats(out, shap, counted)
    out.stats.update(format=fmt.name, scale_rule=rule, axis=axis, shape=list(x.shape), dtype=str(x.dtype), form=form)
    if form == "gain":  # the realised per-block gain against the rebuttal's nominal (s - s*)/s
        live = (s_star > 0).squeeze(-1)
        out.stats["mean_abs_gain"] = float(parts["gain"].squeeze(-1)[live].abs().mean()) if live.any() else 0.0
        nominal = ((s - s_star) / s).squeeze(-1)[live]
        out.stats["mean_abs_nominal_gain"] = float(nominal.abs().mean()) if live.any() else 0.0
    return out


def component_stats(d: Decomposition, shap: dict[str, float] | None, counted: torch.Tensor | None = None,
                    n: int | None = None) -> dict:
    """Per-tensor statistics of a decomposition (see docs/decomposition.md, 'Statistics per tensor');
    fractions and means over the ``counted`` elements (all by default; ``n``: their number where the mask is not
    at hand). ``shap`` None: no Shapley values (a decomposition mapped back from another basis, whose game was
    played there), and no Shapley keys."""
    error = d.error
    total = float(error.pow(2).sum())
    components = {"scale": d.e_scale, "dead": d.e_dead, "grid": d.e_grid}
    energies = {c: float(t.pow(2).sum()) for c, t in components.items()}
    residual = (error - (d.e_scale + d.e_dead + d.e_grid)).abs()
    magnitude = torch.maximum(d.x.abs(), d.quantized.abs()).clamp(min=torch.finfo(torch.float64).tiny)
    if n is None:
        n = d.x.numel() if counted is None else int(counted.sum())
    n_mean = max(n, 1)
    stats = {
        "n": n,
        "signal_energy": float(d.x.pow(2).sum()),
        "energy_total": total,
        "relative_error": math.sqrt(_share(total, float(d.x.pow(2).sum()))),
        "cross_term": total - sum(energies.values()),
        "cross_share": _share(total - sum(energies.values()), total),
        "deadzone_fraction": float(d.dead.sum()) / n_mean,
        "saturation_fraction": float(d.saturated.sum()) / n_mean,
        "identity_residual": float(residual.max()) if n else 0.0,
        "identity_residual_rel": float((residual / magnitude).max()) if n else 0.0,
        "mean_total": float(error.sum()) / n_mean,
    }
    if shap is not None:
        stats["shapley_residual"] = abs(sum(shap.values()) - total)
    for c in COMPONENTS:
        stats[f"energy_{c}"] = energies[c]
        stats[f"share_{c}"] = _share(energies[c], total)
        stats[f"mean_{c}"] = float(components[c].sum()) / n_mean
        if shap is not None:
            stats[f"shapley_{c}"] = shap[c]
            stats[f"shapley_share_{c}"] = _share(shap[c], total)
    for a, b in PAIRS:  # the paper's Figure 1: how aligned the components are
        stats[f"inner_{a}_{b}"] = float((components[a] * components[b]).sum())
        stats[f"cosine_{a}_{b}"] = _cosine(stats[f"inner_{a}_{b}"], energies[a], energies[b])
    return stats


def _cosine(inner: float, energy_a: float, energy_b: float) -> float:
    """<a, b> / (|a| |b|), defined as 0 when either vector is zero."""
    norm = math.sqrt(energy_a * energy_b)
    return inner / norm if norm > 0 else 0.0


def decompose_named(
    tensors: dict[str, torch.Tensor], fmt: str | BlockFormat = "mxfp4", axis: int = -1, scale_rule: str | None = None
) -> dict[str, dict]:
    """Per-tensor statistics of several named tensors (a per-layer breakdown) plus their pooled total."""
    per = {name: decompose(t, fmt, axis, scale_rule).stats for name, t in tensors.items()}
    return {"per_tensor": per, "total": pool_stats(list(per.values()))}


def pool_stats(stats: list[dict]) -> dict:
    """Pool per-tensor statistics into one: energies add, fractions average by element count."""
    n = sum(s["n"] for s in stats)
    total = sum(s["energy_total"] for s in stats)
    pooled = {"n": n, "energy_total": total}
    with_shapley = all(f"shapley_{c}" in s for s in stats for c in COMPONENTS)  # the fused kernel has none
    for c in COMPONENTS:
        pooled[f"energy_{c}"] = sum(s[f"energy_{c}"] for s in stats)
        pooled[f"share_{c}"] = _share(pooled[f"energy_{c}"], total)
        if with_shapley:
            pooled[f"shapley_{c}"] = sum(s[f"shapley_{c}"] for s in stats)
            pooled[f"shapley_share_{c}"] = _share(pooled[f"shapley_{c}"], total)
    if all(f"inner_{a}_{b}" in s for s in stats for a, b in PAIRS):
        for a, b in PAIRS:
            pooled[f"inner_{a}_{b}"] = sum(s[f"inner_{a}_{b}"] for s in stats)
            pooled[f"cosine_{a}_{b}"] = _cosine(pooled[f"inner_{a}_{b}"], pooled[f"energy_{a}"], pooled[f"energy_{b}"])
    pooled["cross_term"] = total - sum(pooled[f"energy_{c}"] for c in COMPONENTS)
    pooled["cross_share"] = _share(pooled["cross_term"], total)
    for key in ("deadzone_fraction", "saturation_fraction"):
        pooled[key] = sum(s[key] * s["n"] for s in stats) / n if n else 0.0
    if all("identity_residual" in s for s in stats):
        pooled["identity_residual"] = max((s["identity_residual"] for s in stats), default=0.0)
    return pooled
