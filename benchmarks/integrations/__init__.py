"""Integration benchmarks: what the verl hook and agent programs as environments cost."""
