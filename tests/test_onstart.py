"""Every rule file's onstart message prints: Snakemake keeps only the last ``onstart``, so the rule files register
theirs (``on_start``) and the Snakefile's one onstart calls them all."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_snakefile_holds_the_only_onstart_and_it_calls_every_registered_message():
    rule_files = sorted((ROOT / "workflow" / "rules").glob("*.smk"))
    assert not [f.name for f in rule_files if re.search(r"^onstart:", f.read_text(), re.M)]
    assert re.search(r"^onstart:\n(    #.*\n)?    for message in ON_START:\n        message\(\)", (ROOT / "Snakefile")
                     .read_text(), re.M)
    registered = [f.name for f in rule_files if "@on_start" in f.read_text()]
    assert {"compare.smk", "leaderboard.smk"} <= set(registered)


def test_two_rule_files_messages_both_print(tmp_path):
    """The pattern run by Snakemake itself: two included files, each registering one message, both printed once."""
    common = (ROOT / "workflow" / "rules" / "common.smk").read_text()
    pattern = common[common.index("ON_START = []"):]
    (tmp_path / "common.smk").write_text(pattern)
    for name in ("a", "b"):
        (tmp_path / f"{name}.smk").write_text(f"@on_start\ndef say_{name}():\n    print('message from {name}')\n")
    (tmp_path / "Snakefile").write_text(
        'include: "common.smk"\ninclude: "a.smk"\ninclude: "b.smk"\n\nrule all:\n    output: touch("done")\n\n'
        "onstart:\n    for message in ON_START:\n        message()\n")
    done = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--quiet", "all"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    assert out.count("message from a") == 1 and out.count("message from b") == 1
