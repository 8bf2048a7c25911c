"""chandy's benchmarks. Not tests: they measure, print JSON and a table, and assert nothing."""
