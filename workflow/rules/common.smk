# What every rule file shares: the config checked against its schema (workflow/schemas/), the profile and
# the run's layout, the interpreter the rules call, and the helpers that name a run's files.
import os
import sys
from pathlib import Path

from snakemake.utils import validate

from mxfp4.machine import pin_cpu_numerics

pin_cpu_numerics()  # before torch loads, here and in every rule's process (mxfp4/machine.py)

import torch

from mxfp4.config.profiles import warm_start_hash
from mxfp4.config.recipes import definition_digest
from mxfp4.config.run import Run
from mxfp4.layout import GPU_SMOKE_DENSE, METRICS, REFERENCE_RECIPE, TRAIN_LOG
from mxfp4.report.figures import FIGURES
from mxfp4.studies import compare_pilot, compared_recipe


def check_config(config, schema_path):
    """The config against its schema, a failure in one line (Snakemake's own message prints the whole schema)."""
    import jsonschema
    import yaml

    schema = yaml.safe_load(open(schema_path))
    problem = next(iter(jsonschema.Draft202012Validator(schema).iter_errors(config)), None)
    if problem is not None:
        where = " ".join(map(str, problem.path))
        raise ValueError(f"--config {where}: {problem.message}; accepted keys: {', '.join(schema['properties'])}"
                         .replace("--config :", "--config:"))
    validate(config, schema_path)  # Snakemake's own validation (defaults), now known to pass


check_config(config, str(Path(workflow.basedir) / "workflow" / "schemas" / "config.schema.yaml"))

# Rules call the package through the interpreter that runs Snakemake, so an unactivated
# `.venv/bin/snakemake` finds the same environment.
MXFP4 = f"{sys.executable} -m mxfp4"
PYTHON = sys.executable
PROFILE = config.get("profile", "embedded")
RUN = Run.of(PROFILE, "results")  # the run's context (mxfp4/config/run.py), made once here
P, L = RUN.profile, RUN.layout  # its settings and every path it reads or writes (mxfp4/layout.py)
MODELS = list(P.models)
TINY_MODELS = P.tiny_models()
RECIPES = list(P.recipes)
SEEDS = list(P.seeds)
COMPARE_RECIPE = compared_recipe(config)
# the claim-level tests with the network as the replicate: where the profile fixes claims at the warm start
NETWORK_CLAIMS = ([str(L.network_claims)] if P.pathways and P.pathways.claims and "warm" in P.pathways.checkpoints
                  else [])


def cell_path(model, recipe, seed, leaf=METRICS):
    return str(L.cell(model, recipe, seed) / leaf)


def model_path(model, warm_start=0):
    return str(L.model(model, warm_start))


def stored_profiles():
    """Every stored profile's folder but this one's (none before anything is stored)."""
    root = L.baselines.parent
    return [f for f in sorted(root.iterdir()) if f.is_dir() and f != L.baselines] if root.is_dir() else []


def store_with_baselines(files, models=()):
    """Copy this run's ``files`` to where the stored baselines keep them (``Layout.stored``), each warm start of
    ``models`` whole (a compare or a network design then trains none: warm_starts=stored)."""
    import shutil

    from mxfp4.io import copy_atomic

    for src in files:
        if src in models:
            shutil.rmtree(L.stored(src), ignore_errors=True)
            shutil.copytree(src, L.stored(src), ignore=shutil.ignore_patterns(".snakemake*"))
        else:
            copy_atomic(src, L.stored(Path(src)))


def warm_start_paths(model, seed=None):
    """A tiny model's warm starts (none for a hub model): the one ``seed`` starts from, or all of them."""
    if model not in TINY_MODELS:
        return []
    if seed is None:
        return [model_path(model, k) for k in range(P.warm_starts)]
    return [model_path(model, P.warm_start_of(int(seed)))]


# the fused CPU kernel, built by its own job before any job that quantizes on CPU (none where CUDA runs them)
CPU_KERNEL = [] if torch.cuda.is_available() else [str(L.cpu_kernel)]
ALL_CELLS = [cell_path(m, r, s) for m in MODELS for r in RECIPES for s in SEEDS]
ALL_EVALS = [str(L.evaluation(m, r, s)) for m in MODELS for r in RECIPES for s in SEEDS]


def study_figures(study="", without=()):
    """The files of the registered figures (mxfp4/report/figures.py) of one study's target (``study``; "" for those
    every run draws), but the figures named in ``without``."""
    return [str(L.figure(f.stem, suffix)) for f in FIGURES.values() if f.study == study and f.name not in without
            for suffix in (".png", ".pdf")]


# what the figures target draws and store_baselines keeps: every registered figure that belongs to no study
FIGURE_FILES = study_figures()


# Each rule file's message before the first job (a cost estimate, a warning): Snakemake keeps only the last
# `onstart`, so the rule files register theirs here and the Snakefile's one onstart calls every one.
ON_START = []


def on_start(message):
    """Register ``message`` (a function of no arguments) to run before the first job."""
    ON_START.append(message)
    return message
