"""`nfc bench`: one training step of each example model in nfc and, in fresh processes of the
same run, PyTorch eager, torch.compile and jax.jit (benchmarks/run_baseline.py), on 1 and 2
threads, from the same initial parameters and inputs.

    models.py   the benchmark models and their sizes (MODELS, resolve)
    driver.py   the plan and the processes (BenchOptions, Runner)
    worker.py   nfc's compile and run processes
    timing.py   the timing protocol and memory measurement every process shares
    report.py   the comparison tables

docs/performance.md has the method, the machine and the numbers.
"""
