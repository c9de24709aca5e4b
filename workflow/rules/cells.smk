def model_input(wc):
    """A tiny model must be warm-started first (a job of one seed: that seed's warm start; else every warm
    start of the model), and on a machine without CUDA the fused CPU kernel built; hub models are fetched by
    the cell itself."""
    return warm_start_paths(wc.model, wc.get("seed")) + CPU_KERNEL


def reference_input(wc):
    """A recipe that steers toward the reference run (AQN adaptive) needs that cell of the same seed first."""
    from mxfp4.config.recipes import Recipe

    return [cell_path(wc.model, REFERENCE_RECIPE, wc.seed)] if Recipe.named(wc.recipe).needs_reference else []


def probe_batch_input(wc):
    """A quantized recipe's probes are taken on its model and seed's common batch (none without probes)."""
    from mxfp4.config.recipes import Recipe

    quantized = Recipe.named(wc.recipe).quantize
    return [str(L.probe_batch(wc.model, wc.seed))] if P.probe_every and quantized else []


def inputs_hash(wc):
    """What a cell is made from (mxfp4.config.profiles.config_hash: the profile's setting for the model,
    the GSM8K files' digest, the recipe, the seed, the code version): Snakemake's params, so a change to
    any of them reruns the cell (the default --rerun-triggers include params)."""
    from mxfp4.config.profiles import config_hash
    from mxfp4.config.recipes import Recipe

    return config_hash(P, wc.model, Recipe.named(wc.recipe), int(wc.seed))


WARM_STARTS = config.get("warm_starts", "train")


def stored_warm_start(wc):
    """With --config warm_starts=stored: a stored warm start of this model made from what the profile gives
    now (its recorded settings), this profile's first, else any profile's (a pilot reuses the networks of the
    profile it shares its SFT with); else a path that does not exist, so that pretrain_model makes it."""
    from mxfp4.rl.models import edited_since, made_from

    warm_start = int(wc.get("warm_start", 0))
    stored = L.stored(L.model(wc.model, warm_start))
    if WARM_STARTS == "stored":
        want = P.warm_start_setting(wc.model, warm_start)
        relative = L.model(wc.model, warm_start).relative_to(L.root)
        for candidate in [stored, *(folder / relative for folder in stored_profiles())]:
            if made_from(candidate, want):
                return str(candidate)
            edited = edited_since(candidate, want)
            if edited:  # the stored warm start this run asks for, changed since: never trained again in silence
                raise ValueError(f"warm_starts=stored: {candidate} has files that differ from the digests recorded "
                                 f"when it was made ({', '.join(edited)}); accepted: restore it (git checkout -- "
                                 f"{candidate}), or warm_starts=train to make a new one")
    return str(stored) + ".not-stored"


def stored_sft(wc):
    """With --config warm_starts=stored, for a profile with outlier channels: a stored warm start of any
    profile made from the same SFT without them (``Profile.sft_setting``), so that the channels are added to
    it rather than the SFT run again; else a path that does not exist."""
    from mxfp4.rl.models import made_from

    warm_start = int(wc.get("warm_start", 0))
    if WARM_STARTS == "stored" and P.pretrain is not None and P.pretrain.outlier_channels:
        relative = L.model(wc.model, warm_start).relative_to(L.root)
        want = P.sft_setting(wc.model, warm_start)
        for profile_folder in stored_profiles():
            if made_from(profile_folder / relative, want):
                return str(profile_folder / relative)
    return str(L.stored(L.model(wc.model, warm_start))) + ".no-sft"


ruleorder: copy_stored_warm_start > outliers_on_stored_sft > pretrain_model
ruleorder: copy_stored_extra_warm_start > outliers_on_stored_extra_sft > pretrain_extra_warm_start


rule copy_stored_warm_start:
    """The stored warm start (committed with the baselines; bit-identical to what pretrain_model makes
    from the same settings), so that a compare against the stored baselines trains no warm start."""
    input:
        stored_warm_start,
    output:
        directory(model_path("{model}")),
    wildcard_constraints:
        model=r"[^/]+",
    params:
        made_from=lambda wc: warm_start_hash(P, wc.model),
    run:
        import shutil

        shutil.copytree(input[0], output[0], ignore=shutil.ignore_patterns(".snakemake*"))


use rule copy_stored_warm_start as copy_stored_extra_warm_start with:
    output:
        directory(model_path("{model}", "{warm_start}")),
    wildcard_constraints:
        model=r"[^/]+",
        warm_start=r"[1-9]\d*",
    params:
        made_from=lambda wc: warm_start_hash(P, wc.model, int(wc.warm_start)),


rule pretrain_model:
    """Warm-start a tiny stand-in with SFT on the embedded problems (TRL SFTTrainer); a change to what
    it is made from (its params) rebuilds it, and then every job that reads it."""
    output:
        directory(model_path("{model}")),
    log:
        str(L.log("pretrain_{model}")),
    wildcard_constraints:
        model=r"[^/]+",
    threads: 1
    params:
        made_from=lambda wc: warm_start_hash(P, wc.model),
    shell:
        "MXFP4_THREADS={threads} {MXFP4} pretrain --profile {PROFILE} --model {wildcards.model} > {log} 2>&1"


rule pretrain_extra_warm_start:
    """A further warm start of a tiny stand-in (pretrain.warm_starts): the same SFT from its own pretraining
    seed (its initialisation, problems and flawed demonstrations)."""
    output:
        directory(model_path("{model}", "{warm_start}")),
    log:
        str(L.log("pretrain_{model}_ws{warm_start}")),
    wildcard_constraints:
        model=r"[^/]+",
        warm_start=r"[1-9]\d*",
    threads: 1
    params:
        made_from=lambda wc: warm_start_hash(P, wc.model, int(wc.warm_start)),
    shell:
        "MXFP4_THREADS={threads} {MXFP4} pretrain --profile {PROFILE} --model {wildcards.model} "
        "--warm-start {wildcards.warm_start} > {log} 2>&1"


rule outliers_on_stored_sft:
    """This profile's warm start from a stored one of the same SFT without outlier channels (``stored_sft``):
    the channels added, bit for bit what pretrain_model makes, without its SFT run."""
    input:
        stored_sft,
    output:
        directory(model_path("{model}")),
    log:
        str(L.log("pretrain_{model}")),
    wildcard_constraints:
        model=r"[^/]+",
    params:
        made_from=lambda wc: warm_start_hash(P, wc.model),
        warm_start=0,
    shell:
        "{MXFP4} pretrain --profile {PROFILE} --model {wildcards.model} --warm-start {params.warm_start} "
        "--sft-from {input} > {log} 2>&1"


use rule outliers_on_stored_sft as outliers_on_stored_extra_sft with:
    output:
        directory(model_path("{model}", "{warm_start}")),
    log:
        str(L.log("pretrain_{model}_ws{warm_start}")),
    wildcard_constraints:
        model=r"[^/]+",
        warm_start=r"[1-9]\d*",
    params:
        made_from=lambda wc: warm_start_hash(P, wc.model, int(wc.warm_start)),
        warm_start=lambda wc: wc.warm_start,


def cell_launcher(wc):
    """`python -m mxfp4`, or the multi-process launcher of the model's launch config (accelerate launch;
    torchrun for CPU DDP) when the profile gives it several processes."""
    from mxfp4.config.profiles import launch_prefix

    return launch_prefix(P.model(wc.model), PYTHON)


rule probe_batches:
    """The GRPO batches every recipe's gradient probes of a model are taken on, one per seed of the profile:
    each sampled once by the seed's starting policy, unquantized, so recipes are probed on the same prompts and
    completions. One process for all of a model's seeds (each batch is seeded and loaded on its own: the same
    bytes as one process a seed), so the imports are paid once."""
    input:
        model_input,
    output:
        [str(L.probe_batch("{model}", seed)) for seed in SEEDS],
    log:
        str(L.log("probe_batch_{model}")),
    threads: 1
    params:
        made_from=lambda wc: RUN.setting_hash(wc.model),
        seeds=" ".join(f"--seed {seed}" for seed in SEEDS),
    shell:
        "MXFP4_THREADS={threads} {MXFP4} probe-batch --profile {PROFILE} --model {wildcards.model} "
        "{params.seeds} > {log} 2>&1"


ruleorder: probe_batches > probe_batch


rule probe_batch:
    """The probe batch of one seed beyond the profile's (a compare's extra seeds, --config compare_seeds=N)."""
    input:
        model_input,
    output:
        str(L.probe_batch("{model}", "{seed}")),
    log:
        str(L.log("probe_batch_{model}_seed{seed}")),
    wildcard_constraints:
        seed=r"\d+",
    threads: 1
    params:
        made_from=lambda wc: RUN.setting_hash(wc.model),
    shell:
        "MXFP4_THREADS={threads} {MXFP4} probe-batch --profile {PROFILE} --model {wildcards.model} "
        "--seed {wildcards.seed} > {log} 2>&1"


rule cell:
    """One ablation cell: GRPO under the recipe, then GSM8K through lm-eval; metrics.json last (atomic).
    A cell checkpoints every grpo.save_steps and a rerun resumes from its last checkpoint (the cell's
    own `checkpoints/` folder is not a declared output, so --rerun-incomplete keeps it)."""
    input:
        model_input,
        reference_input,
        probe_batch_input,
    output:
        metrics=cell_path("{model}", "{recipe}", "{seed}"),
        log=cell_path("{model}", "{recipe}", "{seed}", TRAIN_LOG),
        eval=str(L.evaluation("{model}", "{recipe}", "{seed}")),
    log:
        str(L.cell_log("{model}", "{recipe}", "{seed}")),
    wildcard_constraints:
        seed=r"\d+",
    threads: lambda wc: P.model(wc.model).processes
    resources:
        gpu=lambda wc: P.model(wc.model).gpus,
    params:
        launcher=cell_launcher,
        made_from=inputs_hash,
    shell:
        "MXFP4_THREADS=1 {params.launcher} cell --profile {PROFILE} --model {wildcards.model} "
        "--recipe '{wildcards.recipe}' --seed {wildcards.seed} > {log} 2>&1"
