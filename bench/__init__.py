"""The benchmarks behind ``mokka bench`` and the fidelity scorer: each measures Mokka side by side
with its peer (the real library's figures, NVIDIA's driver, fake-gpu-operator, nvidia-smi) and
prints ratios; none is a timed test.

The top of the stack below the command line: it may use the local cluster, containers and what
is fetched; nothing of the runtime imports it."""
