"""The pathway matrix: each MXFP4 error component injected alone (or removed), measured on the three RL pathways
the paper maps it to (gradient accuracy, rollout quality, policy entropy) on the same data for every arm, with
energy-matched controls, Shapley attribution and the additivity test. Every seed measures its own batches and
prompts; the rows take the policy as the outer unit. Output: a tidy CSV (``spec.FIELDS``) and every unit's harm
beside it (``spec.UNIT_FIELDS``), with a digest of its data.

One module a concern: ``spec`` (the rows' fields, arms and methods: what the reports read, no torch),
``measurement`` (the arms and the passes that measure each unit), ``estimates`` (the rows from the units) and
``matrix`` (one model's matrix over seeds and checkpoints: ``run_pathways``). This file imports none of them, so
a report that reads the spec loads nothing else.

The method in full: docs/methods.md."""
