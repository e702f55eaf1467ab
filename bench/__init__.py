"""The benchmarks of `make bench` (`python -m bench`), and their report."""
