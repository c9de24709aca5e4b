# The paper-replication DAG. Profile: --config profile=embedded|smoke|paper (default embedded).
configfile: "experiments/config.yaml"

PROFILE = config.get("profile", "embedded")
RESULTS = f"results/{PROFILE}"
FIGURES = f"figures/{PROFILE}"

PROFILE_CFG = config.get("profiles", {}).get(PROFILE, {})

include: "workflow/rules/kernels.smk"
include: "workflow/rules/proofs.smk"
include: "workflow/rules/figures.smk"


rule all:
    input:
        rules.figures.input,
        rules.kernel_checks.output,


rule kernels:
    input:
        rules.kernel_checks.output,
        rules.kernel_bench.output,


rule proofs:
    input:
        f"{RESULTS}/proofs/proofs.json",
