# The rules of every registered study (mxfp4/studies/): study_<name> runs `mxfp4 <name>` (on one model of the profile
# for a model study, on the run's files it declares for a profile study; at each value of its axes, e.g. a checkpoint
# or a recipe, each a wildcard) into the files the study declares; a profile study over a model study is handed that
# study's files. The target <name> asks for its outputs (every model and axis value the run gives it) and its figures
# (the figure registry's entries with study="<name>"), e.g.
#   snakemake --cores 2 collapse_map --config profile=real-small-board
#   snakemake --cores 2 entropy_trajectory --config profile=networks-rl
# and store_<name> keeps a profile study's outputs and figures with the baselines beside the files they are
# recomputable from.
import re
from functools import partial

from mxfp4.studies import check_study_settings, registered

STUDIES = registered()
check_study_settings(P)  # every studies: block of the profile names a study and holds what its model accepts


def study_outputs(study, model=None, **axes):
    """A study's files for ``model`` at ``axes``: its output (in the HTML report where it has a caption), then those
    beside."""
    first, *beside = [str(p) for p in study.outputs(L, model, **axes)]
    if study.caption:
        first = report(first, caption=f"../report/{study.caption}.rst", category=study.category)
    return [first, *beside]


# Further options of a study's command that the workflow decides from what it was asked for (a recipe placed on a
# stored board checks the board first): study name -> function of a job's wildcards giving them; the rule files that
# decide them fill it.
STUDY_ARGS = {}


def job_of(study, wc):
    """One job's model (None for a profile study) and axes, from its wildcards."""
    return (wc.model if study.scope == "model" else None), {a: wc[a] for a in study.axes}


def job_inputs(study, wc):
    """What one job further waits for, from its wildcards (``Study.job_inputs``)."""
    model, axes = job_of(study, wc)
    return [str(p) for p in study.job_inputs(L, P, model, **axes)]


def summarised(study, wc):
    """A profile study's model study's outputs at this job's axes (``Study.over``), of every model the workflow
    runs it on."""
    if not study.over:
        return []
    _, axes = job_of(study, wc)
    measured = STUDIES[study.over]
    models = dict.fromkeys(job["model"] for job in measured.jobs(P, config))
    return [str(measured.output(L, m, **axes)) for m in models]


def job_made_from(study, made_from, wc):
    """What one job is made from beyond its inputs: a change reruns it (the study's ``made_from``, read once per rule,
    and the job's ``job_settings``)."""
    model, axes = job_of(study, wc)
    return made_from + study.job_settings(P, model, **axes)


def further_args(study, wc):
    further = STUDY_ARGS[study.name](wc) if study.name in STUDY_ARGS else ""
    return f"{further} " if further else ""


for _study in STUDIES.values():
    # the model (of a model study) and each axis are wildcards of the rule, and options of the command; each takes
    # the values the run gives it (the profile's models, an axis's values), so that a file beside an output
    # (<checkpoint>_units.csv beside <checkpoint>.csv) or a placed recipe's folder (<model>_<recipe>) never reads
    # as another job's output
    _wildcards = (["model"] if _study.scope == "model" else []) + list(_study.axes)
    _values = {"model": MODELS, **_study.axis_values(P, config)}

    rule:
        name:
            _study.rule
        input:
            model_input if _study.scope == "model" else [],
            [str(p) for p in _study.inputs(L, P)],
            partial(job_inputs, _study),
            over=partial(summarised, _study),
        output:
            study_outputs(_study, **{w: f"{{{w}}}" for w in _wildcards}),
        wildcard_constraints:
            **{w: "|".join(map(re.escape, _values[w])) if _values.get(w) else r"[^/]+" for w in _wildcards},
        log:
            str(L.log("_".join([_study.rule, *(f"{{{w}}}" for w in _wildcards)]))),
        params:
            # the shell command is formatted when the job runs, after the loop has moved on: the study's name
            # travels as a param, fixed when the rule is made
            command=_study.name,
            wildcards="".join(f"--{w} '{{{w}}}' " for w in _wildcards),  # a params string takes the job's wildcards
            made_from=partial(job_made_from, _study, _study.made_from(P)),
            further=partial(further_args, _study),
        threads: _study.threads
        priority: _study.priority
        shell:
            "MXFP4_THREADS={threads} {MXFP4} {params.command} --profile {PROFILE} {params.wildcards}{params.further}"
            "--out {output[0]} {input.over} > {log} 2>&1"

    if _study.collect:

        rule:
            name:
                _study.target
            input:
                [str(p) for job in _study.jobs(P, config) for p in _study.outputs(L, **job)],
                study_figures(_study.target),

    if _study.scope == "profile" and _study.stores is not None:

        rule:
            name:
                f"store_{_study.target}"
            input:
                [str(p) for p in _study.stores(L, P)],
                [str(p) for job in _study.jobs(P, config) for p in _study.outputs(L, **job)],
                study_figures(_study.target),
            output:
                touch(str(L.root / f"{_study.target}_stored.flag")),
            run:
                store_with_baselines(input)
