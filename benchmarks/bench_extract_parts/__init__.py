"""The parts of benchmarks/bench_extract.py, one module each, and core.py, what they share."""
