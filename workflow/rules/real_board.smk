# The real-model board: every recipe on a named pretrained model before RL (profile real-small-board), its held-out
# problems the replicate; where W4A4 breaks it (the collapse map); a user's recipe placed on the stored board. The
# registered studies real-board, real-board-place, real-leaderboard and real-leaderboard-place
# (mxfp4/studies/real_board.py) measure and rank; here the rules that store them with the baselines:
#   snakemake --cores 2 store_real_board --config profile=real-small-board     # the board itself, stored
#   snakemake --cores 2 real_leaderboard_place --config profile=real-small-board compare_recipe=R   # R on it
from mxfp4.studies.real_board import REAL_BOARD, REAL_BOARD_PLACE

NAMED_MODELS = [m for m in MODELS if m not in TINY_MODELS]  # pretrained models of the hub or a package
REAL_PLACED = NEW_RECIPE if NEW_RECIPE and NEW_RECIPE not in ("mxfp4", "mxfp4-w4a16", *LEADERBOARD) else None
BOARD_MODEL = NAMED_MODELS[0] if NAMED_MODELS else None


rule store_real_board:
    """Store the real-model board with the baselines (its measures, lm-eval's samples stay behind) and the collapse
    map, then LEADERBOARD.md at results/baselines/ with the network board and this one."""
    input:
        problems=str(REAL_BOARD.output(L, BOARD_MODEL)) if BOARD_MODEL else [],
        record=str(REAL_BOARD.outputs(L, BOARD_MODEL)[1]) if BOARD_MODEL else [],
        units=str(L.leaderboard_units(BOARD_MODEL)) if BOARD_MODEL else [],
        energy=str(L.leaderboard_units(BOARD_MODEL).with_suffix(".energy.json")) if BOARD_MODEL else [],
        collapse=str(STUDIES["collapse-map"].output(L, BOARD_MODEL)) if BOARD_MODEL else [],
        md=str(L.real_leaderboard()),
    output:
        touch(str(L.root / "real_board_stored.flag")),
    run:
        from mxfp4.report.real_board import attach

        collapse_md = Path(input.collapse).with_suffix(".md")
        store_with_baselines([input.problems, input.record, input.units, input.energy, input.collapse, str(collapse_md),
                              input.md, str(Path(input.md).with_suffix(".json"))])
        attach(L.baselines.parent / "LEADERBOARD.md", L.stored(Path(input.md)))


rule store_real_placed:
    """Store the placed recipe on the stored real-model board, once it placed (target real_leaderboard_place): its
    rows of every held-out problem and its record (its training pass over BF16's of its own run), its pathway units
    merged into the stored ones after its run's mxfp4 and bf16 arms reproduced them, the page made again from the
    stored files:
        snakemake --cores 2 store_real_placed --config profile=real-small-board compare_recipe=R"""
    input:
        md=str(L.real_leaderboard(REAL_PLACED)) if REAL_PLACED else [],
        placed=str(REAL_BOARD_PLACE.output(L, BOARD_MODEL, recipe=REAL_PLACED)) if REAL_PLACED else [],
        units=str(L.mechanism_units(REAL_PLACED, BOARD_MODEL)) if REAL_PLACED else [],
    output:
        touch(str(L.root / (f"real_placed_{REAL_PLACED}_stored.flag" if REAL_PLACED else "real_placed_stored.flag"))),
    run:
        from mxfp4.analysis.real_board import ITEM_FIELDS
        from mxfp4.io import write_csv_atomic, write_json_atomic
        from mxfp4.report import real_board
        from mxfp4.report.leaderboard import store_placed_units
        from mxfp4.report.network_claims import read_units

        if not REAL_PLACED:
            raise ValueError("store_real_placed stores a placed recipe: --config compare_recipe=R (R not on the board)")
        stored_dir = L.stored(REAL_BOARD.output(L, BOARD_MODEL)).parent
        items, record = real_board.placed(real_board.read_board(stored_dir),
                                          real_board.read_board(Path(input.placed).parent), REAL_PLACED)
        write_csv_atomic(stored_dir / "items.csv", items, ITEM_FIELDS)
        write_json_atomic(stored_dir / "recipes.json", record)
        stored_units = L.stored(L.leaderboard_units(BOARD_MODEL))
        store_placed_units(stored_units, [input.units], REAL_PLACED)
        store_with_baselines([str(Path(input.units).with_suffix(".energy.json"))])
        page = L.stored(L.real_leaderboard())
        real_board.run(stored_dir, PROFILE, page, read_units([stored_units]))
        real_board.attach(L.baselines.parent / "LEADERBOARD.md", page)
