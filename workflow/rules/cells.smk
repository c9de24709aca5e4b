def model_input(wc):
    """A tiny model must be warm-started first; hub models are fetched by the cell itself."""
    return [f"{RESULTS}/models/{wc.model}"] if wc.model in TINY_MODELS else []


def reference_input(wc):
    """A recipe that steers toward the BF16 run (AQN adaptive) needs the bf16 cell of the same seed first."""
    from mxfp4.config.recipes import Recipe

    if any(c.needs_reference for c in Recipe.named(wc.recipe).build_corrections()):
        return [cell_path(wc.model, "bf16", wc.seed)]
    return []


rule pretrain_model:
    """Warm-start a tiny stand-in with SFT on the embedded problems (TRL SFTTrainer)."""
    output:
        directory(f"{RESULTS}/models/{{model}}"),
    log:
        f"{RESULTS}/logs/pretrain_{{model}}.log",
    threads: 1
    shell:
        "MXFP4_THREADS={threads} {MXFP4} pretrain --profile {PROFILE} --model {wildcards.model} > {log} 2>&1"


def cell_launcher(wc):
    """`python -m mxfp4`, or the multi-process launcher of the model's launch config (accelerate launch;
    torchrun for CPU DDP) when the profile gives it several processes."""
    from mxfp4.config.profiles import launch_prefix

    return launch_prefix(P.model(wc.model), PYTHON)


rule cell:
    """One ablation cell: GRPO under the recipe, then GSM8K through lm-eval; metrics.json last (atomic).
    A cell checkpoints every grpo.save_steps and a rerun resumes from its last checkpoint (the cell's
    own `checkpoints/` folder is not a declared output, so --rerun-incomplete keeps it)."""
    input:
        model_input,
        reference_input,
    output:
        metrics=f"{RESULTS}/cells/{{model}}/{{recipe}}/seed{{seed}}/metrics.json",
        log=f"{RESULTS}/cells/{{model}}/{{recipe}}/seed{{seed}}/train_log.jsonl",
        eval=f"{RESULTS}/cells/{{model}}/{{recipe}}/seed{{seed}}/eval/results.json",
    log:
        f"{RESULTS}/logs/cell_{{model}}_{{recipe}}_seed{{seed}}.log",
    wildcard_constraints:
        seed=r"\d+",
    threads: lambda wc: P.model(wc.model).processes
    resources:
        gpu=lambda wc: P.model(wc.model).gpus,
    params:
        launcher=cell_launcher,
    shell:
        "MXFP4_THREADS=1 {params.launcher} cell --profile {PROFILE} --model {wildcards.model} "
        "--recipe '{wildcards.recipe}' --seed {wildcards.seed} > {log} 2>&1"
