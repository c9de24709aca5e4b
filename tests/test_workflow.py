"""The Snakemake DAG: resolves for every profile; the smoke profile runs to figures; reruns are exact."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test runs Snakemake in a subprocess (a DAG, dry or real)

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def copy_of_the_workflow(d: Path) -> Path:
    """The workflow files copied to ``d``, so runs never touch the checkout's results/."""
    shutil.copy(REPO / "Snakefile", d)
    for sub in ("workflow", "experiments", "kernels"):
        shutil.copytree(REPO / sub, d / sub)
    return d


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return copy_of_the_workflow(tmp_path_factory.mktemp("wf"))


def snakemake(workdir, *args, check=True, env=None):
    r = subprocess.run([*SNAKEMAKE, "--cores", "2", *args], cwd=workdir, capture_output=True, text=True, env=env)
    if check and r.returncode != 0:
        raise AssertionError(r.stdout[-3000:] + r.stderr[-3000:])
    return r.stdout + r.stderr


def planned_jobs(output: str) -> dict[str, int]:
    """Job counts per rule from a dry run's 'Job stats' table."""
    table = output.split("Job stats:")[-1] if "Job stats:" in output else ""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m.group(1) != "total"}


def test_a_compare_on_the_stored_baselines_trains_no_warm_start(workdir):
    """warm_starts=stored: the stored warm starts (made from the profile's current settings) are copied,
    never trained again; without it they are trained."""
    shutil.copytree(REPO / "results" / "baselines", workdir / "results" / "baselines", dirs_exist_ok=True)
    args = ("-n", "compare", "--config", "profile=embedded", "compare_recipe=mxfp4+rht-sr")
    jobs = planned_jobs(snakemake(workdir, *args, "warm_starts=stored"))
    assert "pretrain_model" not in jobs and jobs["copy_stored_warm_start"] == 2, jobs
    jobs = planned_jobs(snakemake(workdir, *args))
    assert jobs["pretrain_model"] == 2 and "copy_stored_warm_start" not in jobs, jobs
    # the mechanism first, one job a model, then the report
    assert jobs["study_mechanism"] == 2 and jobs["study_mechanism_report"] == 1, jobs
    # the pilot: the recipe and the one stored cell rerun here, on the first model and seed
    jobs = planned_jobs(snakemake(workdir, *args, "warm_starts=stored", "compare_pilot=true"))
    assert jobs["cell"] == 2 and jobs["copy_stored_warm_start"] == 1 and "pretrain_model" not in jobs, jobs
    # five seeds: the recipe's 2 models x 5 seeds and one stored cell a model rerun here (the references of
    # seeds 3 and 4 join once the reproduction check has run: a checkpoint, so a dry run cannot list them)
    jobs = planned_jobs(snakemake(workdir, *args, "warm_starts=stored", "compare_seeds=5"))
    assert jobs["cell"] == 2 * 5 + 2, jobs
    # the profile's seeds' probe batches one job a model, the seeds beyond them one job each
    assert jobs["probe_batches"] == 2 and jobs["probe_batch"] == 2 * 2, jobs
    # storing the compare with the baselines runs the compare first
    jobs = planned_jobs(snakemake(workdir, "-n", "store_compare", *args[2:], "warm_starts=stored"))
    assert jobs["store_compare"] == 1 and jobs["compare"] == 1, jobs
    out = snakemake(workdir, *args, "compare_seeds=0", check=False)
    assert "--config compare_seeds: 0 is less than the minimum of 1" in out, out[-1000:]


def test_a_network_design_reuses_stored_networks_and_places_a_recipe_on_the_stored_board(workdir):
    """The pilot takes embedded-large's stored warm starts (its SFT's settings); the design's networks come from its
    own stored ones; a user's recipe on the leaderboard measures its arm alone and its step beside bf16, the
    board's units and step times are the stored ones."""
    shutil.copytree(REPO / "results" / "baselines", workdir / "results" / "baselines", dirs_exist_ok=True)
    jobs = planned_jobs(snakemake(workdir, "-n", "store_network_claims", "--config", "profile=networks-pilot",
                                  "warm_starts=stored"))
    assert "pretrain_model" not in jobs and "pretrain_extra_warm_start" not in jobs, jobs
    assert jobs["copy_stored_warm_start"] == 2 and jobs["copy_stored_extra_warm_start"] == 4, jobs
    assert jobs["study_pathways"] == 2 and jobs["study_network_claims"] == 1, jobs
    placed = ("-n", "leaderboard_place", "--config", "profile=networks", "compare_recipe=mxfp4+tis",
              "warm_starts=stored")
    jobs = planned_jobs(snakemake(workdir, *placed))
    assert jobs["study_mechanism"] == 1 and jobs["leaderboard_bench"] == 1, jobs
    assert jobs["study_leaderboard_place"] == 1, jobs
    assert "study_leaderboard_units" not in jobs and "pretrain_extra_warm_start" not in jobs, jobs
    jobs = planned_jobs(snakemake(workdir, "-n", "store_placed", *placed[2:]))  # storing it places it first
    assert jobs["study_mechanism"] == 1 and jobs["study_leaderboard_place"] == 1 and jobs["store_placed"] == 1, jobs
    real = ("-n", "store_real_placed", "--config", "profile=real-small-board", "compare_recipe=mxfp4-weights-alone")
    jobs = planned_jobs(snakemake(workdir, *real))
    assert jobs["study_real_board_place"] == 1 and jobs["study_mechanism"] == 1, jobs
    assert jobs["study_real_leaderboard_place"] == 1 and "study_real_board" not in jobs, jobs  # the stored board's
    jobs = planned_jobs(snakemake(workdir, "-n", "store_leaderboard", "--config", "profile=networks"))
    assert jobs["study_leaderboard_units"] == 1 and jobs["study_leaderboard"] == 1, jobs
    assert jobs["pretrain_extra_warm_start"] == 7, jobs  # made here, stored


def test_an_outlier_profile_adds_its_channels_to_a_stored_sft_instead_of_training_it(tmp_path):
    """warm_starts=stored: every warm start of the outlier profile comes from a stored one of the same SFT
    without outlier channels (any stored profile's); without it, or with another SFT stored, it is trained."""
    import hashlib
    import json

    from mxfp4.config.profiles import load_profile
    from mxfp4.layout import Layout
    from mxfp4.rl.models import WARM_START_FILES, WARM_START_META

    heavy = load_profile("embedded-large-outliers")
    workdir = copy_of_the_workflow(tmp_path)  # no stored baselines but the ones written here

    def store(setting):
        for model in heavy.tiny_models():
            for k in range(heavy.warm_starts):
                folder = workdir / Layout(workdir / "results", "baselines/sft-source").model(model, k)
                folder.mkdir(parents=True, exist_ok=True)
                for name in WARM_START_FILES:
                    (folder / name).write_text("")
                empty = hashlib.sha256(b"").hexdigest()
                digests = {name: empty for name in WARM_START_FILES if name != WARM_START_META}
                (folder / WARM_START_META).write_text(json.dumps({"provenance": setting(model, k), "digests": digests}))

    args = ("-n", "pretrain", "--config", f"profile={heavy.name}")
    store(heavy.sft_setting)
    jobs = planned_jobs(snakemake(workdir, *args, "warm_starts=stored"))
    assert jobs == {"outliers_on_stored_sft": 2, "outliers_on_stored_extra_sft": 4, "pretrain": 1}, jobs
    jobs = planned_jobs(snakemake(workdir, *args))
    assert jobs == {"pretrain_model": 2, "pretrain_extra_warm_start": 4, "pretrain": 1}, jobs
    store(lambda model, k: {**heavy.sft_setting(model, k), "layers": 2})
    jobs = planned_jobs(snakemake(workdir, *args, "warm_starts=stored"))
    assert jobs == {"pretrain_model": 2, "pretrain_extra_warm_start": 4, "pretrain": 1}, jobs


def test_a_config_typo_is_one_line_naming_the_accepted_keys(workdir):
    out = snakemake(workdir, "-n", "all", "--config", "profle=smoke", check=False)
    assert "--config: Additional properties are not allowed ('profle' was unexpected); accepted keys: profile" in out
    assert len(out.splitlines()) < 12, out


@pytest.mark.parametrize("profile", ["embedded", "smoke", "paper"])
def test_dry_run_resolves_the_full_dag(workdir, profile):
    jobs = planned_jobs(snakemake(workdir, "-n", "all", "--config", f"profile={profile}"))
    n_cells = {"embedded": 2 * 2 * 3, "smoke": 2 * 3, "paper": 2 * 7 * 3}[profile]
    assert jobs["cell"] == n_cells
    assert jobs.get("pretrain_model", 0) == (0 if profile == "paper" else 2)
    checkpoints = {"embedded": 1, "smoke": 2, "paper": 2}[profile]  # pathways.checkpoints: a job per model each
    assert jobs["study_pathways"] == 2 * checkpoints
    assert jobs["probe_batches"] == 2 and "probe_batch" not in jobs  # one per model, for all its seeds
    for rule in ("aggregate", "study_claims", "figure_training", "figure_accuracy", "kernel_checks",
                 "prove_decomposition", "study_pathways_table", "figure_pathways"):
        assert jobs[rule] == 1, rule
    assert jobs.get("study_network_claims", 0) == (1 if profile == "embedded" else 0)  # where the profile fixes claims


def test_each_seeds_cells_start_from_their_own_warm_start(workdir):
    """Two warm starts a model: a seed 1 cell needs warm start 1 (pretrain_extra_warm_start) and no other; the
    full DAG makes both warm starts of each model once."""
    cell = "results/smoke-warm-starts/cells/tiny-dense/bf16/seed1/metrics.json"
    jobs = planned_jobs(snakemake(workdir, "-n", cell, "--config", "profile=smoke-warm-starts"))
    assert jobs.get("pretrain_extra_warm_start") == 1 and "pretrain_model" not in jobs
    jobs = planned_jobs(snakemake(workdir, "-n", "all", "--config", "profile=smoke-warm-starts"))
    assert jobs["pretrain_model"] == 2 and jobs["pretrain_extra_warm_start"] == 2 and jobs["cell"] == 2 * 3 * 2


def test_figures_drives_the_kernel_checks_and_benchmark_of_this_run(workdir):
    """A fresh checkout has no figures: the figures target itself runs the kernel checks and the
    benchmark whose figure it shows, so no figure of another machine passes for this run's."""
    tracked = subprocess.run(["git", "ls-files", "figures"], cwd=REPO, capture_output=True, text=True).stdout.split()
    if tracked:  # in a git checkout: no committed figure under figures/
        assert tracked == ["figures/README.md"], tracked
    jobs = planned_jobs(snakemake(workdir, "-n", "figures", "--config", "profile=embedded"))
    for rule in ("kernel_checks", "kernel_bench", "figure_kernels", "study_pathways_table", "figure_pathways"):
        assert jobs.get(rule) == 1, rule


def test_the_cpu_kernel_is_built_once_before_every_job_that_quantizes(workdir):
    """One job builds the fused CPU kernel; the cells, the pathway matrix and the kernel benchmark and checks
    wait for it (their edges in the DAG), while the warm starts' SFT, which does not quantize, does not."""
    dag = snakemake(workdir, "--dag", "dot", "figures", "--config", "profile=embedded")
    labels = dict(re.findall(r'^\s*(\d+)\[label = "(\w+)', dag, re.M))  # the rule, then its wildcards
    builders = [n for n, rule in labels.items() if rule == "cpu_kernel"]
    assert len(builders) == 1, labels
    waiting = {labels[b] for a, b in re.findall(r"^\s*(\d+) -> (\d+)", dag, re.M) if a == builders[0]}
    assert {"cell", "study_pathways", "probe_batches", "kernel_bench", "kernel_checks"} <= waiting, waiting
    assert "pretrain_model" not in waiting


def test_smoke_profile_runs_to_figures_and_reruns_exactly(workdir):
    snakemake(workdir, "all", "--config", "profile=smoke")
    figures = workdir / "figures" / "smoke"
    for stem in ("decomposition_shares", "correction_effects", "training_curves", "gsm8k_accuracy", "kernel_throughput",
                 "pathway_matrix", "pathway_attribution", "component_cosines"):
        assert (figures / f"{stem}.png").stat().st_size > 10_000
        assert (figures / f"{stem}.pdf").exists()
    assert "| claim |" in (workdir / "results" / "smoke" / "claims.md").read_text()
    # the HTML report: every figure with its caption, the claims table and the cell metrics
    snakemake(workdir, "--report", "report.html", "--config", "profile=smoke")
    html = (workdir / "report.html").read_text()
    for name in ("training_curves.png", "pathway_matrix.png", "claims.md", "cells.csv", "summary.csv",
                 "Lines are the mean over 1 seed(s)", "Each correction's effect on each error component"):
        assert name in html, name
    # a finished target does nothing
    assert "Nothing to be done" in snakemake(workdir, "-n", "all", "--config", "profile=smoke")
    # an edited recipe reruns exactly the cells it defines (the cell rule's params: the config hash of the
    # profile's setting, data, recipe and seed); the warm starts, made from the profile alone, stay
    edited = workdir / "edited_recipes.yaml"
    edited.write_text("mxfp4+all:\n  base: mxfp4\n  corrections: [aqn]\n")
    jobs = planned_jobs(snakemake(workdir, "-n", "all", "--config", "profile=smoke",
                                  env={**os.environ, "MXFP4_RECIPES": str(edited)}))
    assert jobs["cell"] == 2 and "pretrain_model" not in jobs, jobs  # mxfp4+all of both models
    assert "Nothing to be done" in snakemake(workdir, "-n", "all", "--config", "profile=smoke")
    # deleting one cell's output reruns that cell alone (and what depends on it)
    (workdir / "results/smoke/cells/tiny-dense/mxfp4/seed0/metrics.json").unlink()
    jobs = planned_jobs(snakemake(workdir, "-n", "all", "--config", "profile=smoke"))
    assert jobs["cell"] == 1 and "pretrain_model" not in jobs and "kernel_checks" not in jobs
    # one cell by its output path
    out = snakemake(workdir, "results/smoke/cells/tiny-dense/mxfp4/seed0/metrics.json", "--config", "profile=smoke")
    assert (workdir / "results/smoke/cells/tiny-dense/mxfp4/seed0/metrics.json").exists(), out[-2000:]


def test_a_hard_killed_run_of_the_local_profile_resumes_with_the_same_command(workdir):
    """SIGKILL to Snakemake and its cell mid-run leaves outputs marked incomplete (and, without
    nolock, a stale lock); the same command again (local profile: rerun-incomplete, nolock) resumes
    the cell from its checkpoint, with no --unlock. Runs after the smoke workflow above (its
    warm-started models)."""
    import os
    import signal
    import time

    cell = workdir / "results/smoke/cells/tiny-dense/mxfp4+all/seed0"
    if not (workdir / "results/smoke/models/tiny-dense").exists():
        snakemake(workdir, "pretrain", "--config", "profile=smoke")
    (cell / "metrics.json").unlink(missing_ok=True)
    command = [
        *SNAKEMAKE,
        "--profile",
        "workflow/profiles/local",
        "--cores",
        "2",
        str(cell.relative_to(workdir) / "metrics.json"),
        "--config",
        "profile=smoke",
    ]
    proc = subprocess.Popen(
        command, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + 600
    try:
        while not list((cell / "checkpoints").glob("checkpoint-*/mxfp4_state.json")):
            assert proc.poll() is None and time.time() < deadline, "no checkpoint before the run ended"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert list((workdir / ".snakemake" / "incomplete").rglob("*")), "the killed job's outputs are marked incomplete"
    done = subprocess.run(command, cwd=workdir, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (cell / "metrics.json").exists()
    log = (workdir / "results/smoke/logs/cell_tiny-dense_mxfp4+all_seed0.log").read_text()
    assert "resuming" in log  # the rerun (which rewrote the log) continued from the checkpoint


def test_gpu_smoke_and_multi_process_cells_resolve_with_their_launchers(workdir):
    jobs = planned_jobs(snakemake(workdir, "-n", "gpu_smoke", "--config", "profile=gpu-smoke"))
    assert jobs["cell"] == 6 and jobs["gpu_smoke"] == 1 and "pretrain_model" not in jobs
    out = snakemake(workdir, "-n", "-p", "ablations", "--config", "profile=smoke-ddp")
    assert "-m torch.distributed.run --standalone --nproc_per_node 2 -m mxfp4 cell --profile smoke-ddp" in out
    out = snakemake(workdir, "-n", "-p", "ablations", "--config", "profile=paper")
    assert "fsdp2_qwen3_moe_8gpu.yaml --num_processes 8 -m mxfp4 cell --profile paper --model qwen3-30b-a3b" in out
    assert "-m mxfp4 cell --profile paper --model qwen2.5-3b" in out
