# The paper-replication DAG. Profile: --config profile=embedded|smoke|paper (default embedded).
configfile: "experiments/config.yaml"

PROFILE = config.get("profile", "embedded")
RESULTS = f"results/{PROFILE}"
FIGURES = f"figures/{PROFILE}"

include: "workflow/rules/proofs.smk"
include: "workflow/rules/figures.smk"


rule all:
    input:
        rules.figures.input,


rule proofs:
    input:
        f"{RESULTS}/proofs/proofs.json",
