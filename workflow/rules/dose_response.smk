def dose_runs(wc=None):
    """Every model's pathway rows at every dose of the profile's dose_response section."""
    if P.dose_response is None:
        raise ValueError(f"profile {PROFILE!r} has no dose_response section; run the dose-response with "
                         "--config profile=dose-response (experiments/profiles/dose-response.yaml)")
    return [str(L.dose_pathways(m, d)) for m in MODELS for d in P.dose_response.doses]


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
        "--dose {wildcards.dose} --out {output.rows} --units {output.units} > {log} 2>&1"


rule dose_response_table:
    """Where each claim holds: its claim-level test at every dose (one Holm family), and each component's excess
    harm over its control against the dose (the points of the registered figure dose-response)."""
    input:
        dose_runs,
    output:
        csv=str(L.dose_response),
        md=report(str(L.dose_response.with_suffix(".md")), caption="../report/dose_response.rst",
                  category="Dose-response"),
        series=str(L.dose_response_series),
    run:
        from mxfp4.report.dose_response import run as dose_response

        dose_response(P, L, output.csv, output.series)


rule dose_response:
    """The dose-response: its table and its figure."""
    input:
        rules.dose_response_table.output,
        study_figures("dose_response"),


rule store_dose_response:
    """Store the dose-response's table, the figure's points and the figure beside the baselines
    (results/baselines/<profile>/)."""
    input:
        rules.dose_response_table.output,
        study_figures("dose_response"),
    output:
        touch(str(L.root / "dose_response_stored.flag")),
    run:
        store_with_baselines(input)
