"""hostir's official benchmarks, evidence drivers and the generator of docs/PERFORMANCE.md."""
