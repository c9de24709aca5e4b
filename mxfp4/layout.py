"""The results layout: every path the harness reads or writes, in one place (the Snakefile imports it).

A ``Layout(results, profile)`` names the files of one profile under ``results/<profile>/``; its
methods take the same arguments as the cells they describe, so the Snakefile can pass wildcard
patterns (``layout.cell("{model}", "{recipe}", "{seed}")``). ``REFERENCE_RECIPE`` is the
full-precision recipe that other recipes are measured against.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REFERENCE_RECIPE = "bf16"
METRICS = "metrics.json"  # a finished cell's record, written last: its presence marks the cell complete
TRAIN_LOG = "train_log.jsonl"  # in each cell's folder, and in each of its checkpoints
# lm-eval's output in each cell's folder, per evaluation: the warm start under the recipe's quantization
# (before RL), the trained policy under it (after; ``eval/``), and the trained weights
# in full precision (unquantized; a full-precision recipe's "after" is already that, and it has none)
EVAL_FOLDERS = {"before": "eval_before", "after": "eval", "unquantized": "eval_unquantized"}
# with data.holdout arithmetic, the same before and after evaluations on problems that need never-trained arithmetic
ARITHMETIC_EVAL_FOLDERS = {"before": "eval_before_arithmetic", "after": "eval_arithmetic"}
EVAL_RESULTS = "results.json"  # lm-eval's aggregate scores in each evaluation folder
GPU_RESULTS = Path("results/gpu")
BENCH_RESULTS = Path("results/bench")
GPU_SMOKE_DENSE = GPU_RESULTS / "gpu_smoke_dense.json"
# The aggregate tables of a run (``aggregate/``), stored under the same names with the baselines
TABLES = {"cells": "cells.csv", "steps": "steps.csv", "summary": "summary.csv", "items": "items.csv",
          "items_arithmetic": "items_arithmetic.csv"}  # the last only where the profile holds out arithmetic


def series_of(table: Path | str) -> Path:
    """The file beside a study's table that holds its figure's points (``<table stem>_series.csv``)."""
    return Path(table).with_name(f"{Path(table).stem}_series.csv")


@dataclass(frozen=True)
class Layout:
    """The files of one profile's run: ``results`` is the results root, ``profile`` the profile name."""

    results: Path | str
    profile: str

    @property
    def root(self) -> Path:
        return Path(self.results) / self.profile

    def sibling(self, profile: str) -> Layout:
        """The files of another profile's run under the same results root (its stored baselines, read beside
        this run's)."""
        return Layout(self.results, profile)

    # inputs the run makes for itself
    def model(self, model: str, warm_start: int = 0) -> Path:
        """The warm-started tiny model: its first warm start, or its ``warm_start``-th (``models/ws<k>/``)."""
        return self.root / "models" / (f"ws{warm_start}/{model}" if warm_start else model)

    @property
    def data(self) -> Path:
        """The embedded GSM8K-format problems (train.jsonl, test.jsonl) the profile's cells use."""
        return self.root / "data"

    # cells
    def cell(self, model: str, recipe: str, seed: int | str) -> Path:
        return self.cells / model / recipe / f"seed{seed}"

    @property
    def cells(self) -> Path:
        return self.root / "cells"

    def metrics(self, model: str, recipe: str, seed: int | str) -> Path:
        """A cell's ``metrics.json``: the file that says the cell finished."""
        return self.cell(model, recipe, seed) / METRICS

    def evaluation(self, model: str, recipe: str, seed: int | str, stage: str = "after") -> Path:
        """lm-eval's results of one evaluation of a cell (``EVAL_FOLDERS``: before, after, unquantized)."""
        return self.cell(model, recipe, seed) / EVAL_FOLDERS[stage] / EVAL_RESULTS

    def finished_cells(self) -> list[Path]:
        """The ``metrics.json`` of every finished cell of the run, sorted (model, recipe, seed folder)."""
        return sorted(self.cells.glob(f"*/*/seed*/{METRICS}"))

    def policy(self, model: str, seed: int | str) -> Path:
        """The reference cell's policy after GRPO (the pathway matrix's second checkpoint)."""
        return self.cell(model, REFERENCE_RECIPE, seed) / "policy"

    def probe_batch(self, model: str, seed: int | str) -> Path:
        """The GRPO batch every recipe's gradient probes of this model and seed are taken on."""
        return self.root / "probe_batches" / model / f"seed{seed}.pt"

    def cell_log(self, model: str, recipe: str, seed: int | str) -> Path:
        return self.logs / f"cell_{model}_{recipe}_seed{seed}.log"

    # what the later rules write
    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def log(self, name: str) -> Path:
        """The log of one rule's job (``name`` may hold Snakemake wildcards)."""
        return self.logs / f"{name}.log"

    @property
    def aggregate(self) -> Path:
        return self.root / "aggregate"

    def table(self, name: str) -> Path:
        """One aggregate table of the run (``TABLES``: cells, steps, summary, items, items_arithmetic)."""
        return self.aggregate / TABLES[name]

    @property
    def proofs(self) -> Path:
        return self.root / "proofs" / "proofs.json"

    @property
    def corrections(self) -> Path:
        """The correction table (``.json``; the markdown beside it is ``corrections.md``)."""
        return self.root / "corrections.json"

    @property
    def kernels(self) -> Path:
        return self.root / "kernels"

    @property
    def cpu_kernel(self) -> Path:
        """The fused CPU kernel's build report: every job that quantizes waits for it."""
        return self.kernels / "cpu_kernel.json"

    @property
    def kernel_checks(self) -> Path:
        return self.kernels / "checks.json"

    @property
    def kernel_bench(self) -> Path:
        return self.kernels / "bench.json"

    def pathways(self, model: str | None = None, checkpoint: str | None = None) -> Path:
        """One model's pathway rows at one checkpoint (``warm``, ``grpo``), every checkpoint's (no
        checkpoint), or (no model) every model's in one CSV."""
        if model is None:
            return self.root / "pathways" / "pathways.csv"
        return self.root / "pathways" / model / (f"{checkpoint}.csv" if checkpoint else "pathways.csv")

    def pathway_units(self, model: str, checkpoint: str) -> Path:
        """Every unit's harm behind one model's pathway rows at one checkpoint (``pathways.unit_rows``)."""
        return self.root / "pathways" / model / f"{checkpoint}_units.csv"

    def dose_pathways(self, model: str, dose: str, units: bool = False) -> Path:
        """One model's warm-start pathway rows at one outlier dose (``c2x32``), or every unit's harm behind them."""
        return self.root / "dose_response" / model / (f"{dose}_units.csv" if units else f"{dose}.csv")

    @property
    def dose_response(self) -> Path:
        """Every dose's claim-level tests and excess harms in one CSV (``.md`` beside it)."""
        return self.root / "dose_response" / "dose_response.csv"

    @property
    def dose_response_series(self) -> Path:
        """Each component's excess harm over its control per model, pathway and dose: the dose-response figure's
        points (``series_of`` the table)."""
        return series_of(self.dose_response)

    @property
    def depth(self) -> Path:
        """The depth study's slopes and per-layer means, every model (``.md`` beside it)."""
        return self.root / "depth" / "depth.csv"

    @property
    def depth_optimizers(self) -> Path:
        """The short runs' tests and per-layer means, every model (``.md`` beside it)."""
        return self.root / "depth" / "depth_optimizers.csv"

    @property
    def weight_components(self) -> Path:
        """Per weight tensor and decomposition form: shares and component cosines (``.md`` beside it)."""
        return self.root / "weight_components.csv"

    @property
    def regime(self) -> Path:
        """Per model, layer and GEMM operand: the regime statistics (``.md`` beside it, with the literature)."""
        return self.root / "regime.csv"

    @property
    def claims(self) -> Path:
        return self.root / "claims.md"

    @property
    def network_claims(self) -> Path:
        """The claim-level tests decided with the network (warm start) as the replicate, from the per-unit
        files (``mxfp4 network-claims``)."""
        return self.root / "claims_networks.md"

    @property
    def power_pilot(self) -> Path:
        """The pilot's pathway rows a confirmatory profile's power block was calculated from, frozen with the
        design (``mxfp4 power-design`` reads them before the pilot's current stored rows, which a later rerun of
        the pilot may change)."""
        return self.root / "power_pilot_pathways.csv"

    def power_pilot_rows(self, pilot: str) -> Path:
        """Where this profile's power design reads its pilot's rows: the frozen copy stored with this profile's
        baselines, else the pilot's stored pathway matrix."""
        frozen = self.stored(self.power_pilot)
        if frozen.is_file():
            return frozen
        stored = Layout(self.results, pilot)
        return stored.stored(stored.pathways())

    def real_board(self, model: str, recipe: str | None = None) -> Path:
        """The real-model board's measures before RL of one named model (``mxfp4 real-board``): a folder with
        ``items.csv``, ``recipes.json`` and lm-eval's output per evaluated recipe; with ``recipe``, a placed recipe's
        own (it and bf16)."""
        return self.root / "real_board" / (f"{model}_{recipe}" if recipe else model)

    def real_leaderboard(self, recipe: str | None = None) -> Path:
        """The real-model board (``mxfp4 leaderboard --real``; its rows as ``.json``), or a user recipe's place."""
        return self.root / "real_board" / (f"LEADERBOARD_{recipe}.md" if recipe else "LEADERBOARD.md")

    @property
    def report(self) -> Path:
        """The run's results in one page (``mxfp4 report``); the stored baselines have their own."""
        return self.root / "REPORT.md"

    def compare(self, recipe: str) -> Path:
        return self.root / "compare" / f"{recipe}.md"

    def mechanism(self, recipe: str) -> Path:
        """A recipe's mechanism report at the warm starts (``mxfp4 mechanism-report``; its rows as ``.json``)."""
        return self.root / "mechanism" / f"{recipe}.md"

    def mechanism_units(self, recipe: str, model: str) -> Path:
        """One model's per-unit harms of a recipe's mechanism run (``mxfp4 mechanism``; ``.energy.json`` beside)."""
        return self.root / "mechanism" / recipe / f"{model}_units.csv"

    def leaderboard_units(self, model: str) -> Path:
        """One model's per-unit harms of every leaderboard recipe's arm (``mxfp4 mechanism --recipe ...``)."""
        return self.root / "leaderboard" / f"{model}_units.csv"

    @property
    def leaderboard_bench(self) -> Path:
        """The step time of BF16, MXFP4 and every leaderboard recipe in one benchmark run (``bench_step.py``)."""
        return self.root / "leaderboard" / "step_times.json"

    def leaderboard(self, recipe: str | None = None) -> Path:
        """The leaderboard (``mxfp4 leaderboard``; its rows as ``.json``), or a user recipe's place on it."""
        return self.root / "leaderboard" / (f"LEADERBOARD_{recipe}.md" if recipe else "LEADERBOARD.md")

    def contrast(self, other: str) -> Path:
        """This run set beside profile ``other``'s (``mxfp4 profile-contrast``; ``.csv`` beside it)."""
        return self.root / "contrast" / f"{other}.md"

    # committed and drawn elsewhere
    @property
    def baselines(self) -> Path:
        """The stored baselines of this profile (committed)."""
        return Path(self.results) / "baselines" / self.profile

    def stored(self, path: Path) -> Path:
        """Where the stored baselines keep one of the run's files (``path``, a file of this layout): the
        aggregate tables, claims, pathway, regime, dose-response and depth tables side by side, figures under
        ``figures/``, the per-unit files of the pathway matrix under ``units/`` (``<model>_<checkpoint>_units.csv``)
        and the depth study's there too (``<model>_units.csv``), the profile contrasts under ``contrast/``."""
        path = Path(path)
        if path.parent == self.figures:
            return self.baselines / "figures" / path.name
        relative = path.relative_to(self.root)
        if relative.parts[0] == "pathways" and path.name.endswith("_units.csv"):  # one per model: kept apart
            return self.baselines / "units" / f"{relative.parts[1]}_{path.name}"
        if relative.parts[:1] == ("depth",) and len(relative.parts) == 2 and path.name.endswith("_units.csv"):
            return self.baselines / "units" / path.name  # the depth study's per-batch rows, one file a model
        flat = len(relative.parts) == 1 or relative.parts[0] in ("aggregate", "pathways", "dose_response", "depth")
        return self.baselines / (path.name if flat else relative)

    @property
    def figures(self) -> Path:
        """The figures this run draws (``figures/<profile>/``, beside ``results/``)."""
        return Path(self.results).parent / "figures" / self.profile

    def figure(self, name: str, suffix: str = ".png") -> Path:
        return self.figures / f"{name}{suffix}"
