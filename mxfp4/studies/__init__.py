"""The study registry: a study declared in one module, from which its command, its rules and its paths derive.

A study is of one of two kinds. A model study measures one model of a profile (``scope="model"``); a profile study
reads the run's files, its tables or per-unit files, and decides what they say (``scope="profile"``). A ``Study``
names its command (``mxfp4 <name>``, with every study's ``--profile``, ``--results`` and ``--out``, a model
study's ``--model``, plus its own options), the function the command runs, the files it writes under the run's
results, the run's files it reads, its HTML report caption and its section of docs/methods.md. ``mxfp4.cli`` adds
one command per study, and ``workflow/rules/studies.smk`` makes its rules, as the figure registry does for figures:
its rule ``study_<name>`` (``-`` as ``_``; per model for a model study, and per value of each of its axes, such as
a checkpoint or a recipe) and the target ``<name>`` over its outputs (every model and axis value it applies to) and
its figures (the figure registry's entries with ``study="<name>"``), and for a profile study that declares what is
stored with the baselines, ``store_<name>``. A profile study may be ``over`` a model study: its rule is handed that
study's files at its own axes.
A study's own settings are a block of the profile (``studies: {<name>: {...}}``) that its ``settings_model``
validates. A new study is one module (``register_study`` at import; here, or a plugin named in ``$MXFP4_PLUGINS``),
its block in a profile YAML and its paragraph in docs/methods.md.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ValidationError

from ..layout import Layout
from ..plugins import import_plugins

STUDY_NAME = r"^[a-z][a-z0-9-]*$"  # a command name; its rule is study_<name with - as _>
BUILT_IN = ("collapse_map", "depth", "entropy_trajectory", "network_recovery", "headline", "network_claims",
            "dose_response", "claims", "pathways", "mechanism", "leaderboard", "real_board")
SCOPES = ("model", "profile")


@dataclass(frozen=True)
class Study:
    """One study: of one model of a profile, or of a profile's run.

    Args:
        name: the command (``mxfp4 <name>``) and, with ``-`` as ``_``, the Snakemake target and the output folder.
        help: the command's one-line help.
        run: ``module:function`` called as ``function(run, model, out, args)`` (the ``Run``, the model line or None
            for a profile study, the output path, the parsed arguments); it writes ``out`` (and ``beside(out)``)
            and returns the lines the command prints.
        options: ``options(parser, types)`` adds the command's own options to its parser (the common ones are every
            study's); ``types`` is ``mxfp4.cli.arguments``, whose argparse types (``positive_int``, ...) say in
            one line what a bad value is.
        scope: ``model`` (one rule per model, ``--model`` required) or ``profile`` (one rule over the run's files).
        suffix: a model study's output suffix under ``<results>/<profile>/<name>/<model>``.
        loads_models: the command loads transformers models (the CLI then hides torchao from them).
        models: ``models(profile)``, the profile's model lines the study's target runs on (default: every one).
        axes: the study's coordinates beyond its model (e.g. ``checkpoint``, ``recipe``): each is a wildcard of its
            rule, passed to its command as ``--<axis>`` (its ``options`` add them) and to ``path``, ``job_inputs`` and
            ``job_settings`` by name.
        axis_values: ``axis_values(profile, config)``, each axis's values the target runs on (``config``: the
            workflow's, e.g. ``compare_recipe``), and under ``model`` the models where the workflow narrows
            ``models`` (a pilot).
        over: a model study this profile study summarises: its rule waits for that study's outputs at its own
            axes, of every model the workflow runs it on, and passes them to the command as its positional
            arguments.
        path: ``path(layout, model, **axes)``, the output where it is not ``<results>/<profile>/<name>/<model><suffix>``
            (a profile study's, with model None, always).
        beside: ``beside(out)``, the further files the study writes beside its output (its rule declares them).
        figures: ``figures(layout, model, **axes)``, the figures the command draws itself, beside its output (one
            named by an axis, which the figure registry's fixed stems cannot name).
        inputs: ``inputs(layout, profile)``, the run's files the study reads (its rule waits for them and reruns when
            they change), beyond a model study's warm start.
        job_inputs: ``job_inputs(layout, profile, model, **axes)``, what one job further waits for (e.g. the cells a
            checkpoint after GRPO is measured on).
        job_settings: ``job_settings(profile, model, **axes)``, what one job is made from beyond ``settings`` (text;
            e.g. its recipe's definition): a change reruns it.
        stores: ``stores(layout, profile)``, the run's files stored with the baselines beside the outputs by the
            rule ``store_<name>``, so that the outputs are recomputable from what is stored (None: no such rule).
        caption: the stem of the output's caption under ``workflow/report/`` (the HTML report shows the output with
            it); empty: not in the HTML report.
        category: the HTML report's section.
        settings_model: the pydantic model of the study's own block of the profile (``studies: {<name>: {...}}``),
            read with ``settings_of``; None: the study takes none.
        defaults: a profile without the block takes the model's defaults (False: the study does not apply to it,
            ``settings_of`` gives None).
        check: ``check(profile, settings)``, what the block needs of the rest of the profile (a ValueError saying
            what is accepted), checked with the block.
        settings: ``settings(profile)``, the profile's settings the study reads beyond its model and its own block
            (JSON text): the rule reruns when they or the block change.
        collect: make the target ``<name>`` over its outputs and figures (False where a rule of its own collects
            them).
        method: the heading of the study's section in docs/methods.md.
        threads: the cores its rule takes.
        priority: its rule's Snakemake priority (the longest jobs first, so shorter ones fill the other cores).
    """

    name: str
    help: str
    run: str
    method: str
    options: Callable = field(default=lambda parser, types: None)
    suffix: str = ".csv"
    loads_models: bool = True
    threads: int = 1
    scope: str = "model"
    models: Callable = field(default=lambda profile: list(profile.models))
    axes: tuple[str, ...] = ()
    axis_values: Callable = field(default=lambda profile, config: {})
    over: str = ""
    path: Callable | None = None
    beside: Callable = field(default=lambda out: [])
    figures: Callable = field(default=lambda layout, model, **axes: [])
    inputs: Callable = field(default=lambda layout, profile: [])
    job_inputs: Callable = field(default=lambda layout, profile, model, **axes: [])
    job_settings: Callable = field(default=lambda profile, model, **axes: "")
    stores: Callable | None = None
    caption: str = ""
    category: str = "Studies"
    settings_model: type[BaseModel] | None = None
    defaults: bool = True
    check: Callable = field(default=lambda profile, settings: None)
    settings: Callable = field(default=lambda profile: "")
    collect: bool = True
    priority: int = 0

    def __post_init__(self):
        if not re.match(STUDY_NAME, self.name):
            raise ValueError(f"study name {self.name!r}; accepted: lowercase letters, digits and -, starting with a "
                             "letter (it names a command, a rule and a folder)")
        if ":" not in self.run:
            raise ValueError(f"study {self.name!r}: run {self.run!r}; accepted: 'module:function'")
        if self.scope not in SCOPES:
            raise ValueError(f"study {self.name!r}: scope {self.scope!r}; accepted: {', '.join(SCOPES)}")
        if self.scope == "profile" and self.path is None:
            raise ValueError(f"study {self.name!r}: a profile study names its output; accepted: path=lambda layout, "
                             "model: <a path of the layout>")
        if self.axes and self.path is None:
            raise ValueError(f"study {self.name!r}: axes {', '.join(self.axes)} need a named output; accepted: "
                             "path=lambda layout, model, **axes: <a path of the layout>")
        if self.over and self.scope != "profile":
            raise ValueError(f"study {self.name!r}: over={self.over!r} needs a profile study; accepted: "
                             "scope='profile'")
        if {"model", "profile", "results", "out"} & set(self.axes):
            raise ValueError(f"study {self.name!r}: axes {', '.join(self.axes)}; accepted: names other than every "
                             "study's options (model, profile, results, out)")

    @property
    def target(self) -> str:
        """The Snakemake target that runs the study on every model it applies to (``models``)."""
        return self.name.replace("-", "_")

    @property
    def rule(self) -> str:
        """The Snakemake rule that runs the study: on one model (``{model}``), or on the profile's run."""
        return f"study_{self.target}"

    def output(self, layout: Layout, model: str | None = None, **axes) -> Path:
        """The file the study writes for ``model`` (None for a profile study) at ``axes`` in ``layout``'s run."""
        if set(axes) != set(self.axes):
            raise ValueError(f"study {self.name!r}: axes {', '.join(sorted(axes)) or 'none'} given; accepted: "
                             f"{', '.join(self.axes) or 'none'}")
        if self.path is not None:
            return Path(self.path(layout, model, **axes))
        return layout.root / self.target / f"{model}{self.suffix}"

    def outputs(self, layout: Layout, model: str | None = None, **axes) -> list[Path]:
        """Every file the study writes for ``model`` at ``axes``: its output, then those beside it, then the figures
        it draws."""
        out = self.output(layout, model, **axes)
        return [out, *map(Path, self.beside(out)), *map(Path, self.figures(layout, model, **axes))]

    def jobs(self, profile, config: dict) -> list[dict]:
        """The wildcards of every job its target runs: each model it applies to (None for a profile study) at each
        combination of its axes' values."""
        values = self.axis_values(profile, config)
        models = values.get("model", self.models(profile)) if self.scope == "model" else [None]
        combos = [{}]
        for axis in self.axes:
            combos = [{**c, axis: v} for c in combos for v in values.get(axis, [])]
        return [{"model": m, **c} for m in models for c in combos]

    def settings_of(self, profile) -> BaseModel | None:
        """The study's block of ``profile`` validated by its ``settings_model`` and ``check`` (its defaults where the
        profile has none, or None where ``defaults`` is False; None for a study that takes none); a bad block is a
        ValueError naming the key."""
        block = profile.studies.get(self.name)
        if self.settings_model is None:
            if block is not None:
                raise ValueError(f"profile {profile.name!r}: studies.{self.name}: the study takes no settings; "
                                 "accepted: no block")
            return None
        if block is None and not self.defaults:
            return None
        try:
            settings = self.settings_model.model_validate(block or {})
        except ValidationError as err:
            first = err.errors()[0]
            where = "".join(f".{part}" for part in first["loc"])
            raise ValueError(f"profile {profile.name!r}: studies.{self.name}{where}: {first['msg']}") from None
        try:
            self.check(profile, settings)
        except ValueError as err:
            raise ValueError(f"profile {profile.name!r}: studies.{self.name}: {err}") from None
        return settings

    def made_from(self, profile) -> str:
        """What the study's rule is made from beyond its inputs (``settings`` and its own block, as JSON text)."""
        own = self.settings_of(profile)
        return self.settings(profile) + ("" if own is None else own.model_dump_json())

    def function(self) -> Callable:
        module, _, name = self.run.partition(":")
        return getattr(importlib.import_module(module), name)


STUDIES: dict[str, Study] = {}


def compared_recipe(config: dict) -> str:
    """The recipe a run compares, places on a board or measures the mechanism of (``--config compare_recipe=R``)."""
    return config.get("compare_recipe", "mxfp4+all")


def compare_pilot(config: dict) -> bool:
    """A pilot compare (``--config compare_pilot=true``, a string on the command line): the first model and seed."""
    return config.get("compare_pilot") in (True, "true")


def recipe_axis(profile, config: dict) -> dict:
    """The values of a ``recipe`` axis: the run's compared recipe (``axis_values`` of a study of one recipe)."""
    return {"recipe": [compared_recipe(config)]}


def register_study(study: Study) -> Study:
    """Add ``study`` to the registry; a name already taken by another study is an error (one taken by a command of
    ``mxfp4`` is refused when the command line is built).

    Args:
        study: the study.
    """
    have = STUDIES.get(study.name)
    if have is not None and have != study:
        raise ValueError(f"study {study.name!r} is registered twice ({have.run} and {study.run})")
    STUDIES[study.name] = study
    return study


def check_study_settings(profile) -> None:
    """Every block of ``profile.studies`` names a registered study and validates against its settings model."""
    studies = registered()
    for name in profile.studies:
        if name not in studies:
            raise ValueError(f"profile {profile.name!r}: studies.{name}: no registered study {name!r}; accepted: "
                             f"{', '.join(studies)}")
        studies[name].settings_of(profile)


def registered() -> dict[str, Study]:
    """Every study: this package's, then those the ``$MXFP4_PLUGINS`` modules register."""
    for module in BUILT_IN:
        importlib.import_module(f"{__name__}.{module}")
    import_plugins()
    for study in STUDIES.values():
        if not study.over:
            continue
        measured = STUDIES.get(study.over)
        if measured is None or measured.scope != "model" or not set(measured.axes) <= set(study.axes):
            raise ValueError(f"study {study.name!r}: over={study.over!r}; accepted: a registered model study whose "
                             f"axes are among {study.name!r}'s ({', '.join(study.axes) or 'none'})")
    return dict(STUDIES)
