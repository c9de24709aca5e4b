# Two rules a registered study (mxfp4/studies/): study_<name> runs `mxfp4 <name>` on one model of the profile into
# the file the study declares, and the target <name> on every model the study applies to, e.g.
#   snakemake --cores 2 collapse_map --config profile=real-small-board
from mxfp4.studies import registered

STUDIES = registered()

for _study in STUDIES.values():

    rule:
        name:
            _study.rule
        input:
            CPU_KERNEL,
            model_input,
        output:
            str(_study.output(L, "{model}")),
        wildcard_constraints:
            model=r"[^/]+",  # a model's name, never a folder beside the outputs
        log:
            str(L.log(f"{_study.rule}_{{model}}")),
        params:
            # the shell command is formatted when the job runs, after the loop has moved on: the study's name
            # travels as a param, fixed when the rule is made
            command=_study.name,
            made_from=_study.settings(P),  # the profile's settings it reads: a change reruns it
        threads: _study.threads
        shell:
            "MXFP4_THREADS={threads} {MXFP4} {params.command} --profile {PROFILE} --model {wildcards.model} "
            "--out {output} > {log} 2>&1"

    if _study.collect:

        rule:
            name:
                _study.target
            input:
                [str(_study.output(L, m)) for m in _study.models(P)],
