"""The figure registry: every figure the workflow draws, each in one entry that the rest derives from.

``mxfp4 plot <name>`` draws a figure from its input file; the workflow makes one rule per entry
(``figure_<name>``, in ``workflow/rules/figures.smk``), the ``figures`` target asks for every entry's files that
belong to no study, and ``store_baselines`` keeps them; a study's figures are asked for by its own target and kept
by its own store rule. A new figure is a drawing function (``draw(input, out_stem) -> paths``,
in ``mxfp4.report.plots`` or anywhere importable), its entry here and its caption
(``workflow/report/<caption>.rst``, what the HTML report shows beside it)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from ..layout import Layout


@dataclass(frozen=True)
class FigureSpec:
    """One figure: what draws it, from which file of the run, and where it lands.

    Args:
        name: the ``mxfp4 plot`` subcommand's choice and the rule's suffix (``figure_<name>``).
        stem: the file stem under ``figures/<profile>/`` (``<stem>.png`` and ``<stem>.pdf``).
        draw: ``module:function`` (``draw(input, out_stem)`` returning the files it wrote); a bare function name
            is one of ``mxfp4.report.plots``.
        source: the run's input file, from the run's ``Layout``.
        reads: what the input file is, named in the command's help and its errors.
        category: the HTML report's section for the figure.
        caption: the stem of its caption file under ``workflow/report/`` (default: ``stem``).
        columns: the columns a CSV input must have (a table without them would draw an empty figure).
        beside: further files of the run the drawing reads beside its input (the rule reruns when they change).
        study: the Snakemake target of the study the figure belongs to (its target asks for it, not ``figures``:
            the study runs on its own profiles); empty for the figures every run draws.
    """

    name: str
    stem: str
    draw: str
    source: Callable[[Layout], object]
    reads: str
    category: str
    caption: str = ""
    columns: tuple[str, ...] = ()
    beside: Callable[[Layout], list] = lambda layout: []
    study: str = ""

    def drawing(self) -> Callable:
        """The drawing function ``draw`` names."""
        module, _, function = self.draw.rpartition(":")
        return getattr(importlib.import_module(module or f"{__package__}.plots"), function)

    def caption_file(self) -> str:
        return f"{self.caption or self.stem}.rst"


FIGURES: dict[str, FigureSpec] = {}


def register_figure(spec: FigureSpec) -> FigureSpec:
    """Add ``spec`` to the registry (a name or a stem already taken is an error).

    Args:
        spec: the figure's ``FigureSpec``.
    """
    taken = [f.name for f in FIGURES.values() if spec.name == f.name or spec.stem == f.stem]
    if taken:
        raise ValueError(f"figure {spec.name!r} (stem {spec.stem!r}) clashes with the registered {taken[0]!r}")
    FIGURES[spec.name] = spec
    return spec


PATHWAY_ROWS = ("model", "checkpoint", "injection", "metric", "layer", "site", "mean")

for _spec in (
    FigureSpec("decomposition", "decomposition_shares", "decomposition_shares", lambda lay: lay.proofs,
               "proofs.json of mxfp4 prove", "Decomposition"),
    FigureSpec("corrections", "correction_effects", "correction_effects", lambda lay: lay.corrections,
               "corrections.json of mxfp4 corrections-table", "Corrections"),
    FigureSpec("training", "training_curves", "training_curves", lambda lay: lay.table("steps"),
               "aggregate/steps.csv of mxfp4 aggregate", "Cells", columns=("model", "recipe", "seed", "step"),
               beside=lambda lay: [lay.table("cells")]),  # held-out accuracy before and after RL
    FigureSpec("accuracy", "gsm8k_accuracy", "accuracy_bars", lambda lay: lay.table("cells"),
               "aggregate/cells.csv of mxfp4 aggregate", "Cells",
               columns=("model", "recipe", "seed", "gsm8k_strict_accuracy"),
               beside=lambda lay: [lay.table("summary")]),  # the RL gain per problem type
    FigureSpec("kernels", "kernel_throughput", "kernel_throughput", lambda lay: lay.kernel_bench,
               "bench.json of kernels/bench/bench_kernels.py", "Kernels"),
    FigureSpec("pathways", "pathway_matrix", "pathway_matrix", lambda lay: lay.pathways(),
               "pathways/pathways.csv (every model's mxfp4 pathways rows)", "Pathway matrix", columns=PATHWAY_ROWS),
    FigureSpec("attribution", "pathway_attribution", "pathway_attribution", lambda lay: lay.pathways(),
               "pathways/pathways.csv (every model's mxfp4 pathways rows)", "Pathway matrix", columns=PATHWAY_ROWS),
    FigureSpec("cosines", "component_cosines", "component_cosines", lambda lay: lay.weight_components,
               "weight_components.csv of mxfp4 weight-components", "Decomposition",
               columns=("model", "form", "cosine_scale_dead", "cosine_scale_grid", "cosine_dead_grid")),
    FigureSpec("regime", "regime_statistics", "regime_statistics", lambda lay: lay.regime,
               "regime.csv of mxfp4 regime", "Regime", caption="regime",
               columns=("model", "operand", "depth", "elements")),
    FigureSpec("depth", "depth", "mxfp4.report.depth_table:draw", lambda lay: lay.depth,
               "depth/depth.csv of the depth study's table", "Depth", study="depth",
               columns=("model", "layers", "site", "arm", "measure", "distance", "mean", "ci_low", "ci_high")),
    FigureSpec("depth-optimizers", "depth_optimizers", "mxfp4.report.depth_optimizers:draw",
               lambda lay: lay.depth_optimizers, "depth/depth_optimizers.csv of the depth study's short runs", "Depth",
               study="depth_optimizers",
               columns=("model", "layers", "optimizer", "arm", "measure", "distance", "mean", "ci_low", "ci_high")),
    FigureSpec("leaderboard", "leaderboard", "mxfp4.report.leaderboard:draw",
               lambda lay: lay.leaderboard().with_suffix(".json"), "leaderboard/LEADERBOARD.json of mxfp4 leaderboard",
               "Leaderboard", study="leaderboard"),
    FigureSpec("dose-response", "dose_response", "mxfp4.report.dose_response:draw",
               lambda lay: lay.dose_response_series,
               "dose_response/dose_response_series.csv of the dose-response", "Dose-response", study="dose_response",
               columns=("model", "pathway", "component", "dose", "control", "mean", "ci_low", "ci_high")),
):
    register_figure(_spec)
