"""Profiles (``experiments/profiles/<name>.yaml``): the grid of cells and every hyperparameter.

Each profile is validated into ``Profile`` (pydantic, strict): a missing or unknown key at any depth,
a wrong type (``gradient_checkpointing: "no"``) or an out-of-range value (``max_steps: 0``, a negative seed) is a
``ValueError`` that names the key, what was given and what is accepted.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from . import EXPERIMENTS, load_yaml, shipped
from .data_files import data_digest
from .names import SAFE_NAME, SAFE_NAME_HELP
from .recipes import load_recipe_table
from .validation import parse

PROFILES_DIR = EXPERIMENTS / "profiles"
CODE_VERSION = "0.4"  # bump when a change to the package changes what a cell computes


MAX_STEPS = 100_000  # GRPO steps of a cell: beyond any run of the paper (and a typo's 1e20 never starts)
MAX_SEED = 2**32 - 1  # numpy's and torch's seed range


class _Strict(BaseModel):
    """Strict types, no unknown key, and every float finite (``.inf`` and ``.nan`` are refused)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class ModelSpec(_Strict):
    """One model of the grid: a tiny stand-in warm-started here (``arch``), a hub checkpoint (``hub``),
    or a randomly initialised model of a real configuration shipped under ``experiments/models/``
    (``config``: the GPU smoke test of the paper's models, whose weights cannot be downloaded here).

    Master weights and optimizer state are always float32 (a 1e-6 AdamW update on a bfloat16 weight
    near 0.02 is below half its ulp and rounds away); ``compute: bfloat16`` runs the forward and
    backward under bf16 autocast (accelerate's mixed precision), the paper's GPU setting.
    """

    arch: Literal["tiny-dense", "tiny-moe"] | None = Field(None, description="tiny stand-in architecture")
    hub: str | None = Field(None, description="Hugging Face hub id (or a local folder)")
    config: str | None = Field(None, description="random init from experiments/models/<config>.json")
    compute: Literal["float32", "bfloat16"] = Field(
        "float32", description="compute dtype (bfloat16: autocast over fp32 masters)"
    )
    processes: int = Field(1, ge=1, description="training processes of a cell (> 1: accelerate launch with `launch`)")
    launch: str | None = Field(None, description="accelerate config under experiments/accelerate/ (processes > 1)")
    gpus: int = Field(0, ge=0, description="GPUs a cell of this model reserves (the Snakemake `gpu` resource)")
    layers: int | None = Field(None, ge=1, description="tiny stand-ins: decoder layers (default 2)")
    chat: bool = Field(False, description="an instruct model: every prompt is a user turn of its tokenizer's chat "
                                          "template, asking for the final answer after #### (mxfp4.rl.data.prompt)")

    @model_validator(mode="after")
    def _one_source(self):
        if sum(x is not None for x in (self.arch, self.hub, self.config)) != 1:
            raise ValueError(
                "give exactly one of arch (a tiny stand-in), hub (a checkpoint) or config (random init "
                "from experiments/models/<config>.json)"
            )
        if self.config is not None and not (EXPERIMENTS / "models" / f"{self.config}.json").exists():
            raise ValueError(
                f"config {self.config!r}: no experiments/models/{self.config}.json; "
                f"known: {shipped('models', '.json', named_with_suffix=False)}"
            )
        if self.chat and self.arch is not None:
            raise ValueError("chat prompts need a tokenizer with a chat template; a tiny stand-in's has none")
        if self.layers is not None and self.arch is None:
            raise ValueError("layers sets the depth of a tiny stand-in (arch); a hub or config model has its own")
        if self.processes > 1 and self.launch is None:
            raise ValueError(
                f"processes: {self.processes} needs launch: an accelerate config under experiments/accelerate/ "
                f"(known: {shipped('accelerate', '.yaml')})"
            )
        if self.launch is not None and not self.launch_config.exists():
            raise ValueError(
                f"launch {self.launch!r}: no experiments/accelerate/{self.launch}; "
                f"known: {shipped('accelerate', '.yaml')}"
            )
        return self

    def setting(self) -> dict:
        """The spec as a cell's setting records it; ``chat`` only when set, so that a plain-prompt model's
        setting holds no prompt key."""
        out = self.model_dump()
        if not out["chat"]:
            del out["chat"]
        return out

    @property
    def launch_config(self) -> Path | None:
        """The accelerate config file of ``launch`` (None for one process without one)."""
        return None if self.launch is None else EXPERIMENTS / "accelerate" / self.launch

    @property
    def distributed_type(self) -> str | None:
        """accelerate's ``distributed_type`` of the launch config (MULTI_GPU, FSDP, DEEPSPEED, MULTI_CPU)."""
        return None if self.launch is None else load_yaml(self.launch_config).get("distributed_type")

    @property
    def sharded(self) -> bool:
        """True when the launch config shards parameters (FSDP, DeepSpeed ZeRO): no rank holds the
        model whole."""
        return self.distributed_type in ("FSDP", "DEEPSPEED")


class PretrainSettings(_Strict):
    """SFT warm-start of the tiny stand-ins (TRL SFTTrainer)."""

    steps: int = Field(ge=1, le=MAX_STEPS, description="optimizer steps")
    lr: float = Field(gt=0, le=1, description="peak learning rate (cosine schedule)")
    batch_size: int = Field(ge=1)
    n_train: int = Field(ge=1, description="embedded problems to train on")
    flawed_fraction: float = Field(
        0.0, ge=0, le=1, description="share of the demonstrations of problems with a step of a planted flaw that "
        "add instead (mxfp4.problems.flawed_answer): a systematic error of the warm start that the RL reward "
        "corrects")
    flaws: list[Literal["subtraction", "multiplication"]] = Field(
        default_factory=lambda: ["subtraction"], min_length=1,
        description="the planted flaws: the operations a flawed demonstration does as an addition")
    warm_starts: int = Field(
        1, ge=1, description="warm starts per model, each its own pretraining seed (0, 1, ...): the profile's i-th "
        "seed trains and is measured from warm start i mod warm_starts")
    first_seed: int = Field(
        0, ge=0, le=MAX_SEED, description="the pretraining seed of warm start 0 (warm start i: first_seed + i): a "
        "confirmatory design's networks apart from its pilot's")
    outlier_channels: int = Field(
        0, ge=0, description="hidden channels given outlier activations after SFT, the function unchanged "
        "(mxfp4.rl.outlier_channels): the heavy-tail knob")
    outlier_scale: float = Field(32.0, gt=0, description="the outlier channels' factor (a power of two)")

    @field_validator("outlier_scale")
    @classmethod
    def _power_of_two(cls, scale):
        if not 2 <= scale <= 1024 or 2.0 ** round(math.log2(scale)) != scale:
            raise ValueError(f"{scale} is not a power of two in 2..1024 (the outlier-channel "
                             "transform is exact only then); accepted: 2, 4, ..., 1024")
        return scale

    @field_validator("flaws")
    @classmethod
    def _distinct_flaws(cls, flaws):
        if len(set(flaws)) != len(flaws):
            raise ValueError(f"pretrain.flaws {flaws} names a flaw twice; accepted: distinct flaws of subtraction, "
                             "multiplication")
        return flaws

    def recorded(self) -> dict:
        """The settings as a warm start and a cell record them: the planted flaws and the number of warm
        starts only where they differ from one subtraction flaw and one warm start, so that a profile that
        sets neither keeps the settings (and hashes) it had without them."""
        out = self.model_dump()
        if out["flaws"] == ["subtraction"]:
            del out["flaws"]
        if out["warm_starts"] == 1:
            del out["warm_starts"]
        if out["first_seed"] == 0:
            del out["first_seed"]
        return out


class DataSettings(_Strict):
    source: Literal["embedded", "gsm8k"] = Field(description="embedded generator, or real GSM8K jsonl/hub")
    n_train: int | None = Field(None, ge=1, description="embedded: training problems")
    n_eval: int | None = Field(None, ge=1, description="embedded: evaluation problems")
    max_problem_steps: int | None = Field(None, ge=1, description="embedded: arithmetic steps per problem")
    holdout: Literal["questions", "arithmetic"] = Field(
        "questions", description="embedded: what the held-out side holds out: questions (new wording of trained "
        "arithmetic), or arithmetic too: a share of the arithmetic facts never trained (warm start, GRPO, few-shot "
        "pool), and every cell evaluated again on problems that need one (mxfp4.problems.embedded_split)")
    dir: str | None = Field(
        None, description="gsm8k: folder with train.jsonl and test.jsonl (default: $MXFP4_GSM8K_DIR or ../shared)"
    )

    @model_validator(mode="after")
    def _embedded_sizes(self):
        if self.source == "embedded":
            missing = [k for k in ("n_train", "n_eval", "max_problem_steps") if getattr(self, k) is None]
            if missing:
                raise ValueError(f"the embedded source needs {', '.join(missing)}")
        elif self.holdout != "questions":
            raise ValueError(f"data.holdout {self.holdout!r} needs the embedded source (its generator knows the "
                             "arithmetic of every problem); accepted for gsm8k: questions")
        return self

    @property
    def arithmetic_held_out(self) -> bool:
        """Whether a share of the arithmetic is never trained and every cell is evaluated on it too."""
        return self.holdout == "arithmetic"

    def recorded(self) -> dict:
        """The settings as a cell's setting records them: ``holdout`` only where it is not the default, so that
        the settings of a profile that holds out questions alone read as they always have."""
        out = self.model_dump()
        if not self.arithmetic_held_out:
            del out["holdout"]
        return out


class GRPOSettings(_Strict):
    """The GRPO run of every cell (passed to TRL's GRPOConfig)."""

    max_steps: int = Field(ge=1, le=MAX_STEPS)
    learning_rate: float = Field(ge=0, le=1, description="0: the weights never move (the RL gain's null control)")
    num_generations: int = Field(ge=2, description="group size")
    prompts_per_step: int = Field(ge=1)
    max_completion_length: int = Field(ge=1)
    temperature: float = Field(gt=0, le=10, description="sampling temperature of the rollouts")
    beta: float = Field(ge=0, description="KL coefficient (0: no reference model)")
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "dapo"
    reward: Literal["accuracy", "token_parity"] = Field(
        "accuracy",
        description="accuracy: GSM8K's strict answer match; token_parity: the fraction of even token ids, "
        "for random-weight models (no task signal, but advantages that are not all zero)",
    )
    rollout: Literal["hf", "vllm"] = Field(
        "hf",
        description="rollout backend: hf (generate through the patched "
        "model, W4A4, exact to training) or vllm (quantized weights, W4A16)",
    )
    router_aux_loss_coef: float | None = Field(None, ge=0, description="MoE load-balancing loss weight")
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        description="sequences per device per forward/backward "
        "(gradient accumulation makes up the step; None: the whole step at once)",
    )
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass")
    save_steps: int | None = Field(None, ge=1, description="checkpoint every save_steps; a rerun resumes from the last")
    checkpoint_disk_gib: float | None = Field(
        None, gt=0, description="disk one cell's checkpoints may take (checked before the cell runs; None: unchecked)"
    )

    @model_validator(mode="after")
    def _micro_batches(self):
        total = self.num_generations * self.prompts_per_step
        if self.micro_batch_size is not None and total % self.micro_batch_size:
            raise ValueError(
                f"micro_batch_size {self.micro_batch_size} must divide the step's "
                f"num_generations x prompts_per_step = {total} sequences"
            )
        return self

    def accumulation(self, processes: int = 1) -> tuple[int, int]:
        """(sequences per device per micro-batch, gradient accumulation steps) for ``processes`` ranks."""
        total = self.num_generations * self.prompts_per_step
        if total % processes:
            raise ValueError(
                f"num_generations x prompts_per_step = {total} sequences do not split over {processes} processes"
            )
        per_rank = total // processes
        micro = min(self.micro_batch_size or per_rank, per_rank)
        if per_rank % micro:
            raise ValueError(
                f"micro_batch_size {micro} must divide the {per_rank} sequences of each of {processes} processes"
            )
        return micro, per_rank // micro


class EvalSettings(_Strict):
    """GSM8K through lm-eval."""

    num_fewshot: int = Field(ge=0)
    limit: int | None = Field(None, ge=1, description="problems evaluated (None: all)")
    max_gen_toks: int | None = Field(None, ge=1)
    batch_size: int = Field(32, ge=1)


Pathway = Literal["gradient", "rollout", "entropy"]
PATHWAYS = get_args(Pathway)
# a claim-level test by its pathway matrix metric: <pathway>_claim (mechanism) or <pathway>_recovery_claim
ClaimKey = Literal["gradient_claim", "rollout_claim", "entropy_claim", "gradient_recovery_claim",
                   "rollout_recovery_claim", "entropy_recovery_claim", "headline"]


class PowerClaim(_Strict):
    """One mechanism claim's sample size from the pilot: the weakest contrast's effect and the spread of
    its paired differences there, and the units that give the claim its power (``units_for_power``)."""

    effect: float = Field(gt=0, description="pilot's weakest contrast (or the margin, where that is larger)")
    sd: float = Field(gt=0, description="pilot's sd of that contrast's per-unit differences")
    units: int = Field(ge=2, description="units the calculation asks for")


class PowerDesign(_Strict):
    """The power calculation written into a profile before it runs (checked by the tests)."""

    pilot: str = Field(description="the profile whose stored run gave the effects and spreads")
    alpha: float = Field(gt=0, lt=1, description="the primary family's error rate")
    family: int = Field(ge=1, description="hypotheses in the primary family: each tested at alpha / family / 2")
    power: float = Field(gt=0, lt=1)
    claims: dict[Pathway, PowerClaim]
    recoveries: dict[Pathway, PowerClaim] = Field(
        default_factory=dict, description="the recovery claims' sizes (where the profile measures correction arms)")


class NetworkSide(_Strict):
    """The networks one outcome of a claim's test needs, and the rival whose contrast asks for them."""

    networks: int = Field(ge=2)
    rival: str


class NetworkClaimSize(_Strict):
    """One claim's networks: the largest over the outcomes of its three-outcome test (at least 8)."""

    networks: int = Field(ge=2)
    sides: dict[Literal["held", "contradicted", "no dominance"], NetworkSide]


class NetworkPowerDesign(_Strict):
    """The networks a design with the network as the replicate needs, from a pilot of the same design
    (``mxfp4 power-design --units``), written into the profile before it runs (checked by the tests)."""

    pilot: str = Field(description="the profile whose per-unit files gave the between-network spreads")
    alpha: float = Field(gt=0, lt=1, description="the primary family's error rate")
    family: int = Field(ge=1, description="hypotheses in the primary family")
    power: float = Field(gt=0, lt=1)
    level: float = Field(gt=0, lt=1, description="each outcome's level: alpha / family / 3")
    networks: int = Field(ge=2, description="the largest any claim needs")
    claims: dict[str, NetworkClaimSize] = Field(description="per '<model>: <claim>'")


HEADLINE_MAX_MDE = 0.03  # a headline design detecting no less than 3 points goes among the secondary rows


class HeadlineDesign(_Strict):
    """The headline recovery's design with the network as the replicate (mxfp4+all against BF16, final held-out
    accuracy, problems x networks crossed), fixed before its cells run from a pilot of the same design: the
    variance components of a stand-in contrast on the same networks and problems (``stand_in`` against BF16), the
    minimum detectable effect they give at this design's size, and so the headline's family: primary where that
    is at most ``HEADLINE_MAX_MDE``, else a secondary row that says how much data the paper's margin needs
    (``mxfp4 network-recovery --design`` writes it; a test recomputes it from the stored pilot). The network-recovery
    study's block of a profile (``studies: {network-recovery: ...}``)."""

    pilot: str = Field(description="the profile whose stored items.csv gave the variance components")
    stand_in: str = Field(description="the recipe whose difference to bf16 the pilot measured")
    problems: int = Field(ge=2, description="held-out problems a network is evaluated on")
    networks: int = Field(ge=2, description="networks of the design")
    components: dict[Literal["rows", "cols", "residual"], Annotated[float, Field(ge=0)]] = Field(
        description="the pilot's variance components (problems, networks, residual; ``stats.crossed_mean``)")
    mde: float = Field(gt=0, description="the smallest difference the design detects (two-sided 0.05, power 0.8)")
    networks_needed: int | None = Field(
        description="networks the paper's margin needs at this many problems (None: no number suffices)")
    primary: bool = Field(description="in the primary family: mde <= HEADLINE_MAX_MDE")

    @model_validator(mode="after")
    def _family(self):
        if self.primary != (self.mde <= HEADLINE_MAX_MDE):
            raise ValueError(f"primary {self.primary} with mde {self.mde}; accepted: primary exactly where "
                             f"the design detects at most {HEADLINE_MAX_MDE}")
        return self


class MarginRule(_Strict):
    """How a design's margins were fixed before its units were measured: a fraction of MXFP4's whole harm on each
    pathway (its mean harm minus the unquantized arm's) in a pilot's stored per-unit files
    (``network_claims.scaled_margins``; a test recomputes them)."""

    pilot: str = Field(description="the profile whose stored per-unit files gave MXFP4's harm")
    fraction: float = Field(gt=0, lt=1, description="each margin as a fraction of the pilot's MXFP4 - BF16 span")


class ClaimDesign(_Strict):
    """The claim-level primary tests of the pathway matrix, fixed before the run: at the warm start, in
    decomposition form ``form``, component c dominates pathway p when its harm exceeds each other
    component's and its own ``control``'s on the same units (an intersection-union test); contradicted
    when a rival comes within ``margins[p]`` of it (the smallest effect of interest, in the pathway's harm)."""

    form: Literal["canonical", "gain"] = "gain"
    control: Literal["gaussian", "permuted", "signflip"] = "signflip"
    margins: dict[Pathway, Annotated[float, Field(gt=0)]]
    margin_rule: MarginRule | None = Field(None, description="how the margins were computed from a pilot")
    premise_margins: float = Field(
        gt=0, description="the premise of every claim on a pathway: MXFP4's harm there (its one-sided 95% lower "
        "bound over the replicates) is at least this many margins; where it is not, the claims read 'premise not met'")
    analysis: Literal["confirmatory", "re-analysis"] = Field(
        "confirmatory", description="confirmatory: the design (margins, premise, halves) was committed before the "
        "units were measured; re-analysis: it was applied to units already seen")
    replicate: Literal["networks", "units"] = Field(
        "networks", description="what a verdict is about: the model class (networks are the replicates, units nested "
        "in them) or one named pretrained model (its units: gradient batches, prompts)")
    power: PowerDesign | None = None
    network_power: NetworkPowerDesign | None = Field(
        None, description="the networks each claim needs, the network as the replicate (a network design)")
    exploratory: list[ClaimKey] = Field(
        default_factory=list, description="claim-level tests taken out of the primary family before the run (the "
        "power calculation asks for more units than the budget allows): tested as secondary rows")

    @model_validator(mode="after")
    def _every_pathway(self):
        missing = [p for p in PATHWAYS if p not in self.margins]
        if missing:
            raise ValueError(f"claims.margins lacks {missing}; accepted: a margin for each of {', '.join(PATHWAYS)}")
        return self


class PathwaySettings(_Strict):
    """The pathway matrix (``mxfp4 pathways``): how much data each arm is measured on."""

    batches: int = Field(
        ge=2, description="GRPO batches with non-zero advantages per seed and checkpoint (gradient pathway)"
    )
    prompts_per_batch: int | None = Field(
        None, ge=1, description="prompts of a gradient batch (default grpo.prompts_per_step)"
    )
    prompts: int = Field(ge=2, description="prompts per seed and checkpoint (rollout and entropy pathways)")
    samples_per_prompt: int = Field(ge=1, description="sampled completions per prompt")
    sample_every_arm: bool = Field(
        True, description="every arm samples its own rollouts (the sampled accuracy and entropy rows); false: only "
        "the unquantized arm samples, the completions every arm's teacher-forced measures score (what the claims read)")
    prompts_from: Literal["training", "gsm8k-test"] = Field(
        "training", description="where the rollout and entropy pathways' prompts come from: the second half of the "
        "training problems, or the real GSM8K test split (a model trained on generated problems, measured on real "
        "questions and their reference solutions)")
    sites: list[Literal["forward", "backward", "both"]] = Field(
        default_factory=lambda: ["both"], min_length=1, description="GEMM sites of the gradient rows"
    )
    scale_rules: list[Literal["floor", "ceil", "even", "rceil"]] = Field(
        default_factory=lambda: ["floor", "ceil", "even", "rceil"], description="scale rules of the rule row group"
    )
    additivity_steps: list[int] = Field(
        default_factory=lambda: [1, 5], description="k of the additivity test (empty: skip)"
    )
    checkpoints: list[Literal["warm", "grpo"]] = Field(
        default_factory=lambda: ["warm", "grpo"], min_length=1,
        description="policies measured: the warm start and (grpo) every seed's bf16 policy after GRPO",
    )
    forms: list[Literal["canonical", "gain"]] = Field(
        default_factory=lambda: ["canonical"], min_length=1,
        description="decomposition forms whose components the arms inject (each form a full set of arms)",
    )
    controls: list[Literal["gaussian", "permuted", "signflip"]] = Field(
        default_factory=lambda: ["gaussian", "permuted"],
        description="energy-matched control arms of each injected component (+c~k): the excess harm rows "
                    "(signflip keeps each element's magnitude: the fair control where one value dominates a block)",
    )
    corrections: list[str] = Field(
        default_factory=list, description="correction arms: recipes of MXFP4 plus one correction each (mxfp4+macro, "
        "mxfp4+fallback, mxfp4+aqn), measured against MXFP4 on every pathway at site both (the recovery rows)")
    claims: ClaimDesign | None = Field(None, description="the claim-level primary tests (none: no claim rows)")
    held_out_from: str | None = Field(
        None, description="a pilot profile of the same data whose drawn units this matrix never measures: every "
        "problem the pilot's draw could have reached is taken out of the pools first (held out means held out)")
    seeds: list[int] | None = Field(
        None, min_length=1, description="the seeds whose batches and prompts the matrix draws (default every seed "
        "of the profile): where every seed starts from one network (a hub checkpoint), more seeds add units nested "
        "in that network, not networks")

    @model_validator(mode="after")
    def _claims_measured(self):
        c = self.claims
        if c is not None and (c.form not in self.forms or c.control not in self.controls or "both" not in self.sites
                              or "warm" not in self.checkpoints):
            raise ValueError(f"pathways.claims tests form {c.form!r} against control {c.control!r} at the warm start, "
                             f"site both; accepted: a form in forms {self.forms}, a control in controls "
                             f"{self.controls}, with 'both' in sites and 'warm' in checkpoints")
        return self


class DepthOptimizerSettings(_Strict):
    """Short training runs of the depth study (``mxfp4 depth-runs``): from the warm start, one optimizer
    step per GRPO batch with the scale component injected alone, its sign-flip control and no injection, each
    run with SGD and with AdamW. A per-layer gain reaches SGD's update unchanged; Adam divides it out. The
    depth-optimizers study's block of a profile (``studies: {depth-optimizers: ...}``)."""

    optimizers: list[Literal["sgd", "adamw"]] = Field(
        min_length=1, description="optimizers of the runs: sgd (no momentum) and adamw (GRPO's: transformers' "
        "defaults, weight decay 0), adamw at grpo.learning_rate, sgd at the rate that moves the unquantized run's "
        "first step as far as adamw's")
    runs_per_seed: int = Field(ge=1, description="runs per seed, each on its own GRPO batches (the units)")
    skip_runs: int = Field(0, ge=0, description="runs per seed whose batches a pilot used, skipped, so that the test "
                           "runs on batches no earlier run saw")
    steps: int = Field(ge=1, description="optimizer steps of a run, one GRPO batch each")
    site: Literal["forward", "backward", "both"] = Field(
        "backward", description="the GEMMs the injected arms quantize")

    @model_validator(mode="after")
    def _distinct(self):
        if len(set(self.optimizers)) != len(self.optimizers):
            raise ValueError(f"optimizers {self.optimizers} names an optimizer twice; accepted: "
                             "distinct optimizers of sgd, adamw")
        return self


DOSE_PATTERN = r"^c(\d+)x(\d+)$"  # a dose's name: c<outlier channels>x<factor>


class DoseResponseSettings(_Strict):
    """The outlier dose-response: the warm start's pathway matrix again at each dose of outlier channels
    (``mxfp4.rl.outlier_channels``: the function unchanged, so the policy, its batches and its prompts are
    the same at every dose and only where the magnitudes sit in the GEMM operands differs). The dose-response
    study's block of a profile (``studies: {dose-response: ...}``)."""

    doses: list[Annotated[str, Field(pattern=DOSE_PATTERN)]] = Field(
        min_length=2, description="doses named c<channels>x<factor> (c2x32: 2 hidden channels of every layer 32 "
        "times larger; c0x1: none), the factor a power of two")
    source: str = Field(min_length=1, description="the published figures the doses are set against (what real "
                        "LLMs of 4096 hidden dimensions carry), with their sources")

    @model_validator(mode="after")
    def _doses(self):
        if len(set(self.doses)) != len(self.doses):
            raise ValueError(f"doses {self.doses} names a dose twice; accepted: distinct doses")
        for d in self.doses:
            factor = dose(d)[1]
            if factor < 1 or factor & (factor - 1):
                raise ValueError(f"doses: {d!r} has factor {factor}, not a power of two (1, 2, 4, ...): "
                                 "only then is the transform exact")
        return self


def dose(name: str) -> tuple[int, int]:
    """(outlier channels, factor) of a dose's name (``c2x32``: 2 channels, factor 32)."""
    m = re.match(DOSE_PATTERN, name)
    if m is None:
        raise ValueError(f"outlier dose {name!r}; accepted: c<channels>x<factor>, e.g. c2x32 (c0x1: none)")
    return int(m.group(1)), int(m.group(2))


class Profile(_Strict):
    name: str = Field(pattern=SAFE_NAME)
    models: dict[str, ModelSpec] = Field(min_length=1)
    pretrain: PretrainSettings | None = Field(None, description="needed when a model is a tiny stand-in")
    recipes: list[str] = Field(min_length=1, description="named recipes of the grid")
    seeds: list[Annotated[int, Field(ge=0, le=MAX_SEED)]] = Field(min_length=1, description="distinct seeds")
    data: DataSettings
    grpo: GRPOSettings
    probe_every: int = Field(0, ge=0, description="steps between gradient/decomposition probes (0: never)")
    probe_rows: int = Field(
        4096,
        ge=32,
        description="rows (tokens, or weight rows) a decomposition probe samples "
        "per tensor: its memory does not grow with the model's activations",
    )
    eval: EvalSettings
    report_to: list[Literal["tensorboard"]] = Field(
        default_factory=list, description="TRL's report_to for the cells (offline TensorBoard under each cell's "
        "tensorboard/; needs the tensorboard package): where to look, not what is made, so no setting records it")
    pathways: PathwaySettings | None = Field(None, description="the pathway matrix (mxfp4 pathways)")
    leaderboard: list[str] = Field(
        default_factory=list, description="the MXFP4 recipes ranked on the leaderboard (snakemake target leaderboard): "
        "each an arm of the pathway matrix at the warm starts beside MXFP4, BF16 and the correction arms")
    regime_batch: Literal["grpo-probe", "gsm8k-test"] = Field(
        "grpo-probe", description="the batch whose activations and gradients the regime statistics decompose: the "
        "model and seed's GRPO probe batch, or as many sequences of real GSM8K test questions (drawn with the seed) "
        "with their reference solutions, under the teacher-forced loss of the solutions")
    regime_beside: list[str] = Field(
        default_factory=list, description="profiles whose stored regime statistics (results/baselines/<profile>/"
        "regime.csv) the regime table and figure show beside this profile's models")
    bench_shapes: str = Field("", pattern=r"^(\d+x\d+(,\d+x\d+)*)?$", description="kernel benchmark shapes, RxC,...")
    bench_compile_peer: bool = Field(True, description="the CPU kernel benchmark times torch.compile of the reference "
                                     "beside the fused kernel (Inductor's one-off C++ build: about 90 s)")
    studies: dict[str, dict] = Field(
        default_factory=dict, description="settings blocks of registered studies by study name (mxfp4/studies/): "
        "each validated by its study's settings model when the command line or the workflow starts")

    @model_validator(mode="after")
    def _consistent(self):
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds {self.seeds} name a seed twice; accepted: distinct seeds")
        unsafe = [m for m in self.models if not re.match(SAFE_NAME, m)]
        if unsafe:
            raise ValueError(f"model name(s) {unsafe} are not safe folder names; accepted: {SAFE_NAME_HELP}")
        if len(set(self.recipes)) != len(self.recipes):
            raise ValueError(f"recipes {self.recipes} name a recipe twice; accepted: distinct recipes")
        if any(m.arch for m in self.models.values()) and self.pretrain is None:
            raise ValueError("tiny stand-in models need a pretrain section")
        if self.pathways is not None and not set(self.pathways.seeds or []) <= set(self.seeds):
            raise ValueError(f"pathways.seeds {self.pathways.seeds} are not all seeds of the profile; accepted: some "
                             f"of {self.seeds}")
        return self

    def model(self, name: str) -> ModelSpec:
        if name not in self.models:
            raise ValueError(f"model {name!r} is not in profile {self.name!r}; known: {', '.join(self.models)}")
        return self.models[name]

    @property
    def pathway_seeds(self) -> list[int]:
        """The seeds the pathway matrix measures (``pathways.seeds``, else every seed), in the profile's order."""
        chosen = self.pathways.seeds if self.pathways is not None and self.pathways.seeds else self.seeds
        return [s for s in self.seeds if s in chosen]

    def tiny_models(self) -> list[str]:
        return [m for m, s in self.models.items() if s.arch]

    def named_models(self) -> list[str]:
        """The pretrained models (a hub id or a package's file), not the tiny stand-ins."""
        return [m for m, s in self.models.items() if not s.arch]

    @property
    def keeps_reference_policy(self) -> bool:
        """Whether the bf16 cells save their trained policy: only the pathway matrix's ``grpo`` checkpoint
        reads it (at 3B it is 12 GB to write, which gpu-smoke has no use for)."""
        return self.pathways is not None and "grpo" in self.pathways.checkpoints

    def setting(self, model: str) -> dict:
        """Everything of this profile that determines a cell of ``model`` besides recipe and seed: its
        settings, the code version and, for GSM8K, the data files' content digest."""
        out = {
            "model": self.model(model).setting(),
            "code_version": CODE_VERSION,
            "data": self.data.recorded(),
            **self.model_dump(include={"grpo", "probe_every", "probe_rows", "eval"}),
            "pretrain": None if self.pretrain is None else self.pretrain.recorded(),
        }
        if out["grpo"]["reward"] == "accuracy":  # the task's own reward is implied; only another one is named
            del out["grpo"]["reward"]
        if self.data.source == "gsm8k":
            out["data_files"] = data_digest(self)
        return out

    def warm_start_setting(self, model: str, warm_start: int = 0) -> dict:
        """What a tiny stand-in's warm start (the ``warm_start``-th, its pretraining seed) is made from
        (``mxfp4 pretrain``): recorded in it, checked by every job that loads it, and the ``pretrain_model``
        rule's params (a change rebuilds it)."""
        spec = self.model(model)
        self.check_warm_start(warm_start)
        out = {
            "arch": spec.arch,
            "layers": spec.layers,
            "pretrain": None if self.pretrain is None else self.pretrain.recorded(),
            "max_problem_steps": self.data.max_problem_steps,
            "code_version": CODE_VERSION,
        }
        if self.data.arithmetic_held_out:  # what its SFT never saw
            out["holdout"] = self.data.holdout
        return {**out, "warm_start": warm_start} if warm_start else out

    def sft_setting(self, model: str, warm_start: int = 0) -> dict:
        """``warm_start_setting`` without the outlier channels: what the SFT alone is made from. A stored
        warm start with this setting becomes this profile's by adding the channels, bit for bit what
        ``mxfp4 pretrain`` makes (it adds them after the same SFT)."""
        setting = self.warm_start_setting(model, warm_start)
        if setting["pretrain"] is not None:
            defaults = PretrainSettings.model_fields
            setting["pretrain"] = {**setting["pretrain"], "outlier_channels": defaults["outlier_channels"].default,
                                   "outlier_scale": defaults["outlier_scale"].default}
        return setting

    @property
    def warm_starts(self) -> int:
        """Warm starts per tiny model (``pretrain.warm_starts``; 1 without a pretrain section)."""
        return 1 if self.pretrain is None else self.pretrain.warm_starts

    def pretrain_seed(self, warm_start: int = 0) -> int:
        """The pretraining seed of warm start ``warm_start`` (``pretrain.first_seed`` + its index)."""
        self.check_warm_start(warm_start)
        return warm_start + (0 if self.pretrain is None else self.pretrain.first_seed)

    def check_warm_start(self, warm_start: int) -> None:
        """A ValueError unless ``warm_start`` is one of this profile's (0 to ``pretrain.warm_starts`` - 1)."""
        if not 0 <= warm_start < self.warm_starts:
            raise ValueError(f"warm start {warm_start} of profile {self.name!r}; accepted: 0 to {self.warm_starts - 1} "
                             "(pretrain.warm_starts)")

    def warm_start_of(self, seed: int) -> int:
        """The warm start a seed's cells and measurements start from: the seed's place in ``seeds`` modulo
        ``pretrain.warm_starts`` (warm start 0 for every seed where there is one)."""
        if self.warm_starts == 1:
            return 0
        if seed not in self.seeds:
            raise ValueError(f"seed {seed} is not in profile {self.name!r}, whose seeds each start from their own "
                             f"warm start; accepted: {self.seeds}")
        return self.seeds.index(seed) % self.warm_starts


def launch_prefix(spec: ModelSpec, python: str) -> str:
    """The command that starts a cell's processes, up to and including ``-m mxfp4``: the package
    itself for one process; for several, ``accelerate launch`` with the model's launch config, or
    torchrun for a CPU config (accelerate's launcher starts several CPU processes only through MPI;
    accelerate then sets up gloo from torchrun's environment)."""
    if spec.processes == 1:
        return f"{python} -m mxfp4"
    if spec.distributed_type == "MULTI_CPU":
        return f"{python} -m torch.distributed.run --standalone --nproc_per_node {spec.processes} -m mxfp4"
    return (f"{python} -m accelerate.commands.launch --config_file {spec.launch_config} "
            f"--num_processes {spec.processes} -m mxfp4")


def available() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def _merged(base: dict, override: dict) -> dict:
    """``base`` with ``override`` laid over it: mappings merge key by key, anything else is replaced."""
    out = dict(base)
    for key, value in override.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def profile_data(name: str, _children: tuple[str, ...] = ()) -> dict:
    """A profile's settings as written, with ``base: <profile>`` resolved: a profile may name another
    and give only what differs from it (``experiments/profiles/embedded-large-outliers.yaml``)."""
    path = PROFILES_DIR / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(available())}")
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise ValueError(f"profile {path.name}: expected a mapping of keys, got {type(data).__name__}")
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ValueError(f"profile {path.name}: base: {base!r} is not a profile name; known: {', '.join(available())}")
    if base in (name, *_children):
        chain = " -> ".join((*_children, name, base))
        raise ValueError(f"profile {path.name}: base: profiles derive from each other in a cycle ({chain})")
    return _merged(profile_data(base, (*_children, name)), data)


def load_profile(name: str) -> Profile:
    """The profile ``experiments/profiles/<name>.yaml``, its ``base:`` chain merged and every key validated
    (an unknown or missing key, a wrong type or an out-of-range value is a ValueError naming it)."""
    path = PROFILES_DIR / f"{name}.yaml"
    profile = parse(Profile, profile_data(name), f"profile {path.name}")
    if profile.name != name:
        raise ValueError(f"profile {path.name}: name: {profile.name!r} differs from the file name; accepted: {name!r}")

    known = load_recipe_table()
    unknown = [r for r in profile.recipes if r not in known]
    if unknown:
        raise ValueError(f"profile {path.name}: recipes: unknown recipe(s) {unknown}; known: {', '.join(known)}")
    if profile.pathways is not None:
        check_correction_arms(profile.pathways.corrections, known, f"profile {path.name}: pathways.corrections")
    if profile.leaderboard:
        check_leaderboard(profile, known, f"profile {path.name}: leaderboard")
    return profile


def check_leaderboard(profile: Profile, table: dict[str, dict], where: str) -> None:
    """A leaderboard needs the pathway matrix's claim design (its margins) and ranks recipes that quantize with the
    MXFP4 format, activations on, and are not an injection arm."""
    if profile.pathways is None or profile.pathways.claims is None:
        raise ValueError(f"{where}: the leaderboard ranks arms of the pathway matrix at its margins; accepted: a "
                         "profile with pathways.claims")
    for name in profile.leaderboard:
        spec = table.get(name)
        if spec is None:
            raise ValueError(f"{where}: unknown recipe {name!r}; known: {', '.join(table)}")
        if not (spec.get("quantize") and spec.get("format", "mxfp4") == "mxfp4" and spec.get("activations", True)
                and not spec.get("inject") and not spec.get("remove")):
            raise ValueError(f"{where}: {name!r} is not an MXFP4 recipe; accepted: quantize: true, format mxfp4, "
                             "activations on, no inject or remove (e.g. mxfp4+4over6)")
    if len(set(profile.leaderboard)) != len(profile.leaderboard):
        raise ValueError(f"{where}: {profile.leaderboard} names a recipe twice; accepted: distinct recipes")


def check_correction_arms(names: list[str], table: dict[str, dict], where: str) -> None:
    """Each correction arm must be a recipe of ``table`` that quantizes with the MXFP4 format, activations on,
    and at least one correction: the arm measures what its corrections change relative to plain MXFP4."""
    for name in names:
        spec = table.get(name)
        if spec is None:
            raise ValueError(f"{where}: unknown recipe {name!r}; known: {', '.join(table)}")
        if not (spec.get("quantize") and spec.get("format", "mxfp4") == "mxfp4" and spec.get("activations", True)
                and spec.get("corrections") and not spec.get("inject") and not spec.get("remove")):
            raise ValueError(f"{where}: {name!r} is not MXFP4 plus corrections; accepted: a recipe with quantize: "
                             "true, format mxfp4, activations on and one or more corrections (e.g. mxfp4+macro)")
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: {names} names a recipe twice; accepted: distinct recipes")


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def setting_hash(profile: Profile, model: str) -> str:
    """Hash of what a cell's result depends on apart from recipe and seed (paths excluded): cells
    with equal setting hashes are comparable."""
    return _digest(profile.setting(model))


def warm_start_hash(profile: Profile, model: str, warm_start: int = 0) -> str:
    """Hash of what a tiny stand-in's warm start is made from (``Profile.warm_start_setting``)."""
    return _digest(profile.warm_start_setting(model, warm_start))


def differences(recorded: dict, now: dict, prefix: str = "") -> list[str]:
    """The keys (dotted paths) whose values differ between two nested settings, each as
    ``key: recorded -> now``: what a refusal names."""
    out = []
    for key in dict.fromkeys([*recorded, *now]):
        a, b = recorded.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


def config_hash(profile: Profile, model: str, recipe, seed: int) -> str:
    """Hash of exactly what determines a cell's result: the profile's setting for the model, the
    recipe, the seed and the code version; nothing about where results are written."""
    return _digest({"setting": profile.setting(model), "recipe": recipe.to_dict(), "seed": seed})
