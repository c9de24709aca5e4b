rule aggregate:
    """Tidy CSVs: one row per cell, one per cell-step, one per cell and GSM8K problem (lm-eval's samples),
    and per (model, recipe) means with CIs over seeds."""
    input:
        ALL_CELLS,
    output:
        cells=report(str(L.table("cells")), caption="../report/cells.rst", category="Cells"),
        steps=str(L.table("steps")),
        summary=report(str(L.table("summary")), caption="../report/summary.rst", category="Cells"),
        problems=str(L.table("items")),
        arithmetic=[str(L.table("items_arithmetic"))] if P.data.arithmetic_held_out else [],
    log:
        str(L.log("aggregate")),
    shell:
        "{MXFP4} aggregate --profile {PROFILE} > {log} 2>&1"


rule corrections_table:
    """Each correction's effect on each component, on the standard distributions and the tiny models."""
    input:
        [model_path(m) for m in TINY_MODELS],
    output:
        md=str(L.corrections.with_suffix(".md")),
        json=str(L.corrections),
    log:
        str(L.log("corrections_table")),
    params:
        models=lambda wc, input: " ".join(f"--model {m}={p}" for m, p in zip(TINY_MODELS, input)),
    shell:
        "{MXFP4} corrections-table --out {output.md} --json {output.json} {params.models} > {log} 2>&1"


rule claims:
    """The paper's claims against what this profile measured, with seeds and intervals."""
    input:
        cells=str(L.table("cells")),
        problems=str(L.table("items")),  # the precondition rows (read beside cells.csv)
        proofs=str(L.proofs),
        corrections=str(L.corrections),
        pathways=str(L.pathways()),
        # the mechanism and recovery claims: three outcomes on the per-unit files, the design's replicate
        units=[str(L.pathway_units(m, "warm")) for m in MODELS] if NETWORK_CLAIMS else [],
    output:
        report(str(L.claims), caption="../report/claims.rst", category="Claims"),
    log:
        str(L.log("claims")),
    shell:
        "{MXFP4} claims --profile {PROFILE} --cells {input.cells} --proofs {input.proofs} "
        "--corrections {input.corrections} --pathways {input.pathways} --units {input.units:q} "
        "--out {output} > {log} 2>&1"


rule network_claims:
    """The claim-level tests with the network (warm start) as the replicate, recomputed from every model's
    per-unit file: three outcomes with the deciding rival, each half of the networks apart."""
    input:
        [str(L.pathway_units(m, "warm")) for m in MODELS] if NETWORK_CLAIMS else [],
    output:
        report(str(L.network_claims), caption="../report/claims.rst", category="Claims"),
    log:
        str(L.log("network_claims")),
    shell:
        "{MXFP4} network-claims --profile {PROFILE} {input} --out {output} > {log} 2>&1"


rule report_md:
    """The run's results in one page: held-out accuracy, the pathway matrix's headline, the claims."""
    input:
        summary=str(L.table("summary")),
        claims=str(L.claims),
        pathways=str(L.pathways()),
        network=NETWORK_CLAIMS,
    output:
        str(L.report),
    log:
        str(L.log("report")),
    shell:
        "{MXFP4} report --profile {PROFILE} > {log} 2>&1"


rule entropy_trajectory:
    """The entropy claim during RL with the network as the replicate (a profile of several warm starts with
    bf16, mxfp4 and mxfp4+aqn cells, networks-rl): each recipe's entropy gap to BF16 per network, AQN against
    MXFP4 in three symmetric outcomes, on all networks and on each fixed half."""
    input:
        str(L.table("steps")),
    output:
        md=report(str(L.entropy_trajectory), caption="../report/entropy_trajectory.rst", category="Claims"),
        csv=str(L.entropy_trajectory.with_suffix(".csv")),
    log:
        str(L.log("entropy_trajectory")),
    shell:
        "{MXFP4} entropy-trajectory --profile {PROFILE} --steps {input} --out {output.md} > {log} 2>&1"


rule store_entropy_trajectory:
    """Store an entropy-trajectory run with the baselines: its cells and steps tables and the test (recomputable
    from the stored steps.csv by `mxfp4 entropy-trajectory --steps`)."""
    input:
        str(L.table("cells")),
        str(L.table("steps")),
        str(L.entropy_trajectory),
        str(L.entropy_trajectory.with_suffix(".csv")),
    output:
        touch(str(L.root / "entropy_trajectory_stored.flag")),
    run:
        store_with_baselines(input)


rule network_recovery:
    """The headline recovery with the network as the replicate (a profile with a headline design, networks-rl):
    mxfp4+all against BF16 per held-out problem and network on the crossed model, in the family the design fixed,
    on all networks and on each fixed half."""
    input:
        cells=str(L.table("cells")),
        problems=str(L.table("items")),
        arithmetic=[str(L.table("items_arithmetic"))] if P.data.arithmetic_held_out else [],
    output:
        md=report(str(L.network_recovery), caption="../report/network_recovery.rst", category="Claims"),
        csv=str(L.network_recovery.with_suffix(".csv")),
    log:
        str(L.log("network_recovery")),
    shell:
        "{MXFP4} network-recovery --profile {PROFILE} --cells {input.cells} --items {input.problems} "
        "--out {output.md} > {log} 2>&1"


rule store_network_recovery:
    """Store a headline run with the baselines: its cells and per-problem tables and the test (recomputable from
    the stored items.csv by `mxfp4 network-recovery --items`, its design by `--design`)."""
    input:
        str(L.table("cells")),
        str(L.table("items")),
        [str(L.table("items_arithmetic"))] if P.data.arithmetic_held_out else [],
        str(L.network_recovery),
        str(L.network_recovery.with_suffix(".csv")),
    output:
        touch(str(L.root / "network_recovery_stored.flag")),
    run:
        store_with_baselines(input)


rule headline:
    """A named model's headline (real-small-headline): the tested W4A4 recipe and plain MXFP4 against BF16's own
    seed-to-seed band, over its GRPO seeds x held-out problems, on all seeds and each fixed half; every seed's
    curves."""
    input:
        cells=str(L.table("cells")),
        problems=str(L.table("items")),
        steps=str(L.table("steps")),
    output:
        md=str(L.headline),
        csv=str(L.headline.with_suffix(".csv")),
        fig=str(L.headline.with_name("headline_curves.png")),
    log:
        str(L.log("headline")),
    shell:
        "{MXFP4} headline --profile {PROFILE} --aggregate {L.aggregate} --out {output.md} > {log} 2>&1"


rule store_headline:
    """Store the headline with the baselines: the cells, steps and per-problem tables, the test and the curves
    (recomputable from the stored tables by `mxfp4 headline --aggregate results/baselines/<profile>`)."""
    input:
        str(L.table("cells")),
        str(L.table("steps")),
        str(L.table("items")),
        str(L.headline),
        str(L.headline.with_suffix(".csv")),
        str(L.headline.with_name("headline_curves.png")),
    output:
        touch(str(L.root / "headline_stored.flag")),
    run:
        store_with_baselines(input)
