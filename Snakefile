# The paper-replication DAG. Every rule calls the `mxfp4` package (its CLI, or a script under kernels/).
#
#   snakemake --cores all figures                          # embedded profile (default)
#   snakemake --cores all figures --config profile=smoke   # a minute or two
#   snakemake --profile workflow/profiles/local figures     # resumable: a killed run continues where it stopped
#   snakemake --profile workflow/profiles/slurm all --config profile=paper
#   snakemake --cores all gpu_smoke --config profile=gpu-smoke   # on a GPU: results/gpu/gpu_smoke_dense.json
#   snakemake --cores 1 results/embedded/cells/tiny-dense/mxfp4/seed0/metrics.json   # one cell alone
#   snakemake --cores all compare --config compare_recipe=mxfp4+macro              # against stored baselines
#   snakemake --cores all dose_response --config profile=dose-response   # claims against outlier dose
#   snakemake --cores all depth --config profile=depth                   # the depth law of scale bias
configfile: "experiments/config.yaml"

# `snakemake --report report.html` after a run: every figure with its caption, the claims table and
# the cell metrics (workflow/report/).
report: "workflow/report/workflow.rst"

include: "workflow/rules/common.smk"
include: "workflow/rules/kernels.smk"
include: "workflow/rules/proofs.smk"
include: "workflow/rules/cells.smk"
include: "workflow/rules/studies.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/compare.smk"
include: "workflow/rules/leaderboard.smk"
include: "workflow/rules/real_board.smk"
include: "workflow/rules/gpu.smk"


rule all:
    default_target: True
    input:
        rules.figures.input,
        rules.kernel_checks.output,
        str(L.claims),
        NETWORK_CLAIMS,


rule kernels:
    input:
        rules.kernel_checks.output,
        rules.kernel_bench.output,


rule proofs:
    input:
        str(L.proofs),


rule pretrain:
    input:
        [p for m in TINY_MODELS for p in warm_start_paths(m)],


rule pathways:
    input:
        str(L.pathways()),


rule ablations:
    input:
        ALL_CELLS,


rule eval:
    input:
        ALL_EVALS,


onstart:
    # the one onstart Snakemake keeps: every rule file's message (ON_START, workflow/rules/common.smk)
    for message in ON_START:
        message()
