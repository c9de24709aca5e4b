# The rules of every registered study (mxfp4/studies/): study_<name> runs `mxfp4 <name>` (on one model of the profile
# for a model study, on the run's files it declares for a profile study) into the files the study declares; the
# target <name> asks for its outputs (every model it applies to) and its figures (the figure registry's entries with
# study="<name>"), e.g.
#   snakemake --cores 2 collapse_map --config profile=real-small-board
#   snakemake --cores 2 entropy_trajectory --config profile=networks-rl
# and store_<name> keeps a profile study's outputs and figures with the baselines beside the files they are
# recomputable from.
from mxfp4.studies import check_study_settings, registered

STUDIES = registered()
check_study_settings(P)  # every studies: block of the profile names a study and holds what its model accepts


def study_outputs(study, model=None):
    """A study's files for ``model``: its output (in the HTML report where it has a caption), then those beside."""
    first, *beside = [str(p) for p in study.outputs(L, model)]
    if study.caption:
        first = report(first, caption=f"../report/{study.caption}.rst", category=study.category)
    return [first, *beside]


for _study in STUDIES.values():
    if _study.scope == "profile":

        rule:
            name:
                _study.rule
            input:
                [str(p) for p in _study.inputs(L, P)],
            output:
                study_outputs(_study),
            log:
                str(L.log(_study.rule)),
            params:
                # the shell command is formatted when the job runs, after the loop has moved on: the study's name
                # travels as a param, fixed when the rule is made
                command=_study.name,
                made_from=_study.made_from(P),  # the profile's settings it reads: a change reruns it
            threads: _study.threads
            shell:
                "MXFP4_THREADS={threads} {MXFP4} {params.command} --profile {PROFILE} --out {output[0]} > {log} 2>&1"

    else:

        rule:
            name:
                _study.rule
            input:
                CPU_KERNEL,
                model_input,
                [str(p) for p in _study.inputs(L, P)],
            output:
                study_outputs(_study, "{model}"),
            wildcard_constraints:
                model=r"[^/]+",  # a model's name, never a folder beside the outputs
            log:
                str(L.log(f"{_study.rule}_{{model}}")),
            params:
                command=_study.name,
                made_from=_study.made_from(P),
            threads: _study.threads
            shell:
                "MXFP4_THREADS={threads} {MXFP4} {params.command} --profile {PROFILE} --model {wildcards.model} "
                "--out {output[0]} > {log} 2>&1"

    if _study.collect:

        rule:
            name:
                _study.target
            input:
                [str(p) for m in (_study.models(P) if _study.scope == "model" else [None])
                 for p in _study.outputs(L, m)],
                study_figures(_study.target),

    if _study.scope == "profile" and _study.stores is not None:

        rule:
            name:
                f"store_{_study.target}"
            input:
                [str(p) for p in _study.stores(L, P)],
                [str(p) for p in _study.outputs(L)],
                study_figures(_study.target),
            output:
                touch(str(L.root / f"{_study.target}_stored.flag")),
            run:
                store_with_baselines(input)
