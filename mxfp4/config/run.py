"""The run context: a profile's settings with every path its run reads or writes, made once at the entry point
(the command line, a Snakemake job, a user's script) and handed down, and a cell of it with its recipe, seed
and hash resolved. ``rl/`` and ``analysis/`` take these (``report/`` the layouts) instead of a profile, a results
root and a model name each, so no module rebuilds a ``Layout`` or looks a profile up again."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..layout import Layout
from .profiles import ModelSpec, Profile, config_hash, load_profile, setting_hash
from .recipes import Recipe


@dataclass(frozen=True)
class Run:
    """One profile's run.

    Args:
        profile: the validated profile (``load_profile``).
        layout: where its files live (``Layout(results, profile.name)``); ``Run.of`` makes both.
    """

    profile: Profile
    layout: Layout

    def __post_init__(self):
        if self.layout.profile != self.profile.name:
            raise ValueError(f"a run of profile {self.profile.name!r} cannot write the layout of "
                             f"{self.layout.profile!r}; accepted: Run.of(profile, results)")

    @classmethod
    def of(cls, profile: Profile | str, results: Path | str = "results") -> Run:
        """The run of ``profile`` (a ``Profile``, or the name of one in experiments/profiles/) under the results
        root ``results``.

        Args:
            profile: a ``Profile`` or a profile's name.
            results: the results root (the run writes under ``results/<profile>/``).
        """
        profile = load_profile(profile) if isinstance(profile, str) else profile
        return cls(profile, Layout(results, profile.name))

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def results(self) -> Path:
        """The results root (the parent of the profile's folder)."""
        return Path(self.layout.results)

    def model(self, name: str) -> ModelSpec:
        """The profile's line for model ``name`` (a ValueError naming the known ones otherwise)."""
        return self.profile.model(name)

    def setting_hash(self, model: str) -> str:
        """What a model's cells depend on apart from recipe and seed (``config.profiles.setting_hash``)."""
        return setting_hash(self.profile, model)

    def cell(self, model: str, recipe: Recipe | str, seed: int, recipes_file: str | None = None) -> CellSpec:
        """A cell of this run, every name checked (an unknown model or recipe, a bad seed: a ValueError).

        Args:
            model: a model line of the profile.
            recipe: a ``Recipe`` or a recipe's name (``Recipe.named``).
            seed: the cell's seed (an integer >= 0).
            recipes_file: an extra recipes YAML for a recipe given by name.
        """
        if seed is None:
            raise ValueError("a cell needs a seed (an integer >= 0), got None")
        self.start(model, seed)
        recipe = recipe if isinstance(recipe, Recipe) else Recipe.named(recipe, recipes_file)
        return CellSpec(self, model, seed, recipe)

    def start(self, model: str, seed: int | None = None) -> Start:
        """A model of this run from a seed: what every recipe's cell of that model and seed starts from (an unknown
        model or a bad seed: a ValueError).

        Args:
            model: a model line of the profile.
            seed: the cells' seed (it picks the warm start and the probe batch); None: the model's first warm start.
        """
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.model(model)
        return Start(self, model, seed)


@dataclass(frozen=True)
class Start:
    """A model of a run from a seed: what every recipe's cell of that model and seed shares (the starting policy,
    the probe batch). ``Run.start`` makes it, names checked; a cell's is ``CellSpec.start``.

    Args:
        run: the run.
        model: a model line of the run's profile.
        seed: the cells' seed; None where only the model matters (its first warm start).
    """

    run: Run
    model: str
    seed: int | None

    @property
    def profile(self) -> Profile:
        return self.run.profile

    @property
    def layout(self) -> Layout:
        return self.run.layout

    @property
    def spec(self) -> ModelSpec:
        """The model's line of the profile (architecture or hub id, compute dtype, processes)."""
        return self.run.model(self.model)

    @property
    def warm_start(self) -> int:
        """The index of the warm start it starts from (``Profile.warm_start_of``; the first without a seed)."""
        return 0 if self.seed is None else self.profile.warm_start_of(self.seed)


@dataclass(frozen=True)
class CellSpec(Start):
    """One cell of a run: a model under a recipe from a seed (``Run.cell`` makes it, names checked), the one object
    the command line and the rule hand down to the trainer.

    Args:
        run: the run the cell belongs to.
        model: a model line of the run's profile.
        seed: the cell's seed (initialisation, data order, sampling).
        recipe: the recipe the cell trains under.
    """

    recipe: Recipe

    @property
    def start(self) -> Start:
        """What the cell starts from, shared with every other recipe's cell of its model and seed."""
        return Start(self.run, self.model, self.seed)

    @property
    def out(self) -> Path:
        """The cell's folder."""
        return self.layout.cell(self.model, self.recipe.name, self.seed)

    @property
    def config_hash(self) -> str:
        """Exactly what determines the cell's result (``config.profiles.config_hash``)."""
        return config_hash(self.profile, self.model, self.recipe, self.seed)
