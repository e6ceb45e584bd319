"""Developer tooling beside the command line: fetchers (Debian packages, Go builds), a private
containerd driven through CRI, the demo, benchmarks and the fidelity scorer.

Nothing in the runtime layers imports this package: a long-running plugin never loads it."""
