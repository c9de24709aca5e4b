# The dose-response's measurements: each model's pathway matrix at each outlier dose. The table, its test and its
# figure are the registered study dose-response (mxfp4/studies/dose_response.py; target dose_response).
rule dose_pathways:
    """The warm start's pathway matrix at one outlier dose: the same policy (the transform keeps the
    function), batches and prompts as at every other dose."""
    input:
        model_input,
    output:
        rows=str(L.dose_pathways("{model}", "{dose}")),
        units=str(L.dose_pathways("{model}", "{dose}", units=True)),
    log:
        str(L.log("dose_{model}_{dose}")),
    wildcard_constraints:
        dose=r"c\d+x\d+",
    threads: 1
    shell:
        "MXFP4_THREADS={threads} {MXFP4} pathways --profile {PROFILE} --model {wildcards.model} --checkpoint warm "
        "--dose {wildcards.dose} --out {output.rows} > {log} 2>&1"  # its units beside the rows
