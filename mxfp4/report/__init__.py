"""Reports: tidy aggregates, statistics, the claims table, comparison with stored baselines, figures."""
