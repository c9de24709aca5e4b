"""The table of each correction's effect on each component (``mxfp4 corrections-table``)."""

from __future__ import annotations

import torch

from ..config.recipes import Recipe
from ..corrections import build
from ..corrections.registry import paper_corrections
from ..nn import gemm_weights, targets
from ..nn.patch import decoder_layer
from ..numerics.decompose import pool_stats
from ..numerics.hooks import lifecycle
from ..numerics.quantizer import Operand, Quantizer
from ..rl.models import TINY_ARCHS, build_tiny, load
from ..verify.distributions import sample

# each correction's rows, as its class declares them (``Correction.table_settings``), the paper's in its pathways'
# order
TABLE_CORRECTIONS = [{"name": cls.name, **settings} for cls in paper_corrections().values()
                     for settings in cls.table_settings]
TABLE_DISTS = ["gaussian", "laplace", "student_t3", "llm_rows"]


def model_weights(source: str) -> dict[str, tuple[torch.Tensor, int, Operand]]:
    """``weight_operands`` of a checkpoint folder or hub id, or of a randomly initialised tiny stand-in when
    ``source`` is its name."""
    return weight_operands(build_tiny(source)[0] if source in TINY_ARCHS else load(source)[0])


def weight_operands(model) -> dict[str, tuple[torch.Tensor, int, Operand]]:
    """(weight, reduction axis, its forward GEMM operand) of every GEMM weight of ``model`` the mxfp4 recipe
    quantizes."""
    out = {}
    for name, module, _ in targets(model, ("linear", "experts")):
        for attr, p in gemm_weights(module).items():
            out[f"{name}.{attr}"] = (p.detach(), p.dim() - 1, Operand("weight", "forward", name))
    return out


# what a weight kept in BF16 contributes to the pooled statistics: no error energy, nothing truncated or saturated
ZERO_WHEN_KEPT = ("energy_", "shapley_", "inner_", "deadzone_fraction", "saturation_fraction", "identity_residual")


def _kept(quantizer: Quantizer, tensors: dict[str, tuple]) -> set[int]:
    """The decoder layers ``quantizer``'s recipe keeps in BF16 among the tensors' layers (none for a sample)."""
    layers = [decoder_layer(op.layer) for _, _, op in tensors.values() if op is not None]
    layers = [i for i in layers if i is not None]
    if quantizer.bf16_layers is None or not layers:
        return set()
    return quantizer.bf16_layers.kept(max(layers) + 1)


def recorded_activations(model, batch: dict, rows: int = 256) -> dict[str, tuple]:
    """(input, reduction axis, its forward GEMM operand) of every decoder Linear the mxfp4 recipe quantizes, recorded
    on one unquantized forward of ``batch`` (the first ``rows`` token rows of each, flattened)."""
    recorded, handles = {}, []
    for name, module, _ in targets(model, ("linear",)):
        def hook(_, args, name=name):
            x = args[0].detach().reshape(-1, args[0].shape[-1])[:rows].float()
            recorded[name] = (x, -1, Operand("activation", "forward", name))
        handles.append(module.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            model(**batch)
    finally:
        for h in handles:
            h.remove()
    return recorded


def _gemm_transforms(quantizer: Quantizer, tensors: dict[str, tuple]) -> dict:
    """{operand: its forward GEMM's transform} where ``quantizer`` transforms each GEMM from its two operands
    (``gemm_transform``): each layer's weight and recorded activation together give it; an operand without its
    partner cannot be placed in the basis the recipe quantizes it in, and is refused."""
    if not quantizer.transforms_gemm:
        return {}
    pairs: dict = {}
    for t, _, op in tensors.values():
        if op is None or op.gemm != "forward":
            raise ValueError(f"recipe {quantizer.name!r} transforms each GEMM from its activation and weight together; "
                             "a tensor without its GEMM (a distribution's sample) has no basis to be quantized in. "
                             "Accepted: a model's weights with their recorded activations (mxfp4 mechanism)")
        pairs.setdefault(op.layer, {})[op.role] = (t, op)
    out = {}
    for layer, roles in pairs.items():
        if set(roles) != {"activation", "weight"}:
            raise ValueError(f"recipe {quantizer.name!r} transforms each GEMM from its activation and weight "
                             f"together; layer {layer!r} has its {', '.join(roles)} alone. Accepted: a model's "
                             "weights with their recorded activations (mxfp4 mechanism)")
        transform = quantizer.gemm_transform(roles["activation"][0], roles["weight"][0], layer)
        out.update({op: transform for _, op in roles.values()})
    return out


def _stats(quantizer: Quantizer, tensors: dict[str, tuple], form: str = "canonical",
           alongside: dict[str, tuple] | None = None) -> dict:
    """Pooled decomposition, each tensor in the basis ``quantizer`` quantizes it in (a distribution's
    sample has no operand context: a rotating correction rotates it; a GEMM transform is computed from each layer's
    weight and recorded activation, the partner operand taken from ``alongside`` where ``tensors`` are of one role
    alone, ``_gemm_transforms``); a weight of a layer the recipe keeps in BF16
    has no error (its elements still count)."""
    kept = _kept(quantizer, tensors)
    transforms = _gemm_transforms(quantizer, {**tensors, **(alongside or {})})

    def stats(t, axis, op):
        out = quantizer.decompose(t, axis, operand=op, form=form, transform=transforms.get(op)).stats
        if op is None or decoder_layer(op.layer) not in kept:
            return out
        return {k: 0.0 if k.startswith(ZERO_WHEN_KEPT) else v for k, v in out.items()}  # no error: its elements count

    return pool_stats([stats(t, axis, op) for t, axis, op in tensors.values()])


def _arms(recipes) -> list[tuple[str, Quantizer, dict]]:
    """(label, quantizer, cost) of every table correction, then of every named recipe's corrections together."""
    arms = []
    for spec in TABLE_CORRECTIONS:
        c = build(spec)
        label = spec["name"] + "(" + ", ".join(f"{k}={v}" for k, v in spec.items() if k != "name") + ")"
        arms.append((label, Quantizer(corrections=[c]), lifecycle(c.cost)))
    for name in recipes:
        quantizer = Recipe.named(name).quantizer()
        if quantizer is None or quantizer.fmt.name != "mxfp4":
            raise ValueError(f"--recipe {name!r}: the table sets MXFP4 corrections against plain MXFP4; "
                             "accepted: a recipe that quantizes to mxfp4")
        arms.append((f"recipe {name}", quantizer, quantizer.cost()))  # BF16 layers' storage: the real board's column
    return arms


def rows(sources: dict[str, dict[str, tuple]], recipes=()) -> list[dict]:
    out = []
    arms = _arms(recipes)
    for source, tensors in sources.items():
        base = _stats(Quantizer(), tensors)
        for label, quantizer, cost in arms:
            after = _stats(quantizer, tensors)
            out.append(
                {
                    "source": source,
                    "correction": label,
                    **{
                        f"{k}_before": base[k]
                        for k in ("energy_scale", "deadzone_fraction", "energy_grid", "energy_dead", "energy_total")
                    },
                    **{
                        f"{k}_after": after[k]
                        for k in ("energy_scale", "deadzone_fraction", "energy_grid", "energy_dead", "energy_total")
                    },
                    **cost,
                }
            )
    return out


def build_sources(models: dict[str, str] | None = None) -> dict:
    """The standard distributions, then the weights of each ``label -> checkpoint`` (default: both
    tiny stand-ins at random init)."""
    sources = {d: {d: (sample(d, 256, 1024, seed=0), -1, None)} for d in TABLE_DISTS}
    for label, source in (models or {a: a for a in TINY_ARCHS}).items():
        sources[f"{label} weights" + (" (random init)" if source in TINY_ARCHS else "")] = model_weights(source)
    return sources


def _pct(before: float, after: float) -> str:
    return f"{100 * (after - before) / before:+.0f}%" if before else "n/a"


def markdown(table: list[dict]) -> str:
    lines = [
        "# Effect of each correction on each component of the MXFP4 error",
        "",
        "Generated by `mxfp4 corrections-table`; energies are sums of squares over the tensor(s), pooled",
        "over all GEMM weights for the models. Scale bias is the target of macro-block scaling, the deadzone",
        "the target of outlier fallback. Costs: extra storage bits per element, fraction kept in BF16.",
        "",
        "| source | correction | scale-bias energy | deadzone fraction | grid-noise energy | total error energy "
        "| extra bits/elem | BF16 fraction |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in table:
        lines.append(
            f"| {r['source']} | {r['correction']} "
            f"| {r['energy_scale_before']:.4g} → {r['energy_scale_after']:.4g} "
            f"({_pct(r['energy_scale_before'], r['energy_scale_after'])}) "
            f"| {r['deadzone_fraction_before']:.4f} → {r['deadzone_fraction_after']:.4f} "
            f"| {r['energy_grid_before']:.4g} → {r['energy_grid_after']:.4g} "
            f"| {r['energy_total_before']:.4g} → {r['energy_total_after']:.4g} "
            f"({_pct(r['energy_total_before'], r['energy_total_after'])}) "
            f"| {r['extra_bits_per_element']:.3f} | {r['bf16_fraction']:.4f} |"
        )
    lines += ["", "AQN acts on the rollout policy (RMSNorm weights), not on tensors, so it has no row here."]
    return "\n".join(lines) + "\n"


def recipe_energy(tensors: dict[str, tuple], recipe: str, form: str = "canonical",
                  alongside: dict[str, tuple] | None = None) -> dict:
    """The pooled error energy of each component (and the total) of ``tensors`` under plain MXFP4 (``_before``)
    and under ``recipe`` (``_after``), each tensor in the basis the recipe quantizes it in, each operand told to the
    recipe's hooks as what it is, in the decomposition ``form`` (the gain form is where a block quantizer moves the
    deadzone and the grid noise; the canonical one holds them at the ideal scale). ``alongside``: the other operands
    of the same GEMMs (the recorded activations of weights), from which a GEMM transform is computed."""
    quantizer = Recipe.named(recipe).quantizer()
    before, after = _stats(Quantizer(), tensors, form), _stats(quantizer, tensors, form, alongside)
    keys = ("energy_scale", "energy_dead", "energy_grid", "energy_total", "deadzone_fraction")
    return {**{f"{k}_before": before[k] for k in keys}, **{f"{k}_after": after[k] for k in keys}}


def product_error(weights: dict[str, tuple], activations: dict[str, tuple], recipe: str) -> dict:
    """The forward GEMMs' output error, pooled over every layer with both operands: ||Q(X) Q(W)^T - X W^T||^2 under
    plain MXFP4 (``energy_total_before``) and under ``recipe`` (``_after``: its operands as the step quantizes them,
    a GEMM transform's in its basis, a layer it keeps in BF16 exact), float64 products; ``signal``: ||X W^T||^2.
    The measure every change of basis is judged by: an operand's own energies weigh its channels as the operand
    does, the product as the GEMM does."""
    quantizer = Recipe.named(recipe).quantizer()
    kept = _kept(quantizer, {**weights, **activations})
    by_layer = {op.layer: (t, op) for t, _, op in activations.values()}
    before = after = signal = 0.0
    plain = Quantizer()
    with torch.no_grad():
        for w, _, w_op in weights.values():
            if w_op.layer not in by_layer or w.dim() != 2:
                continue
            x, x_op = by_layer[w_op.layer]
            exact = x.double() @ w.double().T
            signal += float(exact.pow(2).sum())
            before += float((plain(x, -1).double() @ plain(w, -1).double().T - exact).pow(2).sum())
            if decoder_layer(w_op.layer) in kept:
                continue
            transform = quantizer.gemm_transform(x, w, w_op.layer)
            qx = quantizer(x, -1, operand=x_op, transform=transform) if quantizer.activations else x
            qw = quantizer(w, -1, operand=w_op, transform=transform)
            after += float((qx.double() @ qw.double().T - exact).pow(2).sum())
    if not signal:
        raise ValueError("no layer has both its weight and its recorded activation: no GEMM product to measure")
    return {"energy_total_before": before, "energy_total_after": after, "signal": signal}
