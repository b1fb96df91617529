"""Benchmarks: each is a function that runs a workload and returns one flat dict of
figures; ``plait bench NAME`` prints it as one JSON object."""
