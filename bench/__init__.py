"""Benchmarks of bastion against the runtimes a user would pick instead (`bench/run` runs them all)."""
