"""Credit benchmarks: how well each method's credit matches ground truth, and what computing it costs."""
