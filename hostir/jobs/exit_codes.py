"""The exit codes of ``python -m hostir.run``, one per class of failure (docs/JOBS.md);
``hostir.run`` exports them, ``hostir.jobs.preflight``'s refusals carry them."""

# 1 is also Python's own status for an uncaught exception, which prints a traceback: a
# bug, not a refusal.
EXIT_CHECK_FAILED = 1   # --check found a result outside its tolerance
EXIT_USAGE = 2          # a bad flag, value or combination, or a problem hostir refuses
EXIT_WORLD_SIZE = 3     # a number of ranks the job cannot use
EXIT_OUTPUT = 4         # an output path that cannot be written, or one refused
EXIT_MEMORY = 5         # the problem would not fit in the memory free on the device
EXIT_DEPENDENCY = 6     # an optional package the flags need is not installed
EXIT_NO_DEVICE = 7      # CUDA work without a visible CUDA GPU (or with --device cpu)
EXIT_RUN_FAILED = 8     # a failure while running: a collective, a peer, a kernel
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT): the shell's convention, 128 + the signal's number

EXIT_CODES = {
    EXIT_CHECK_FAILED: "check failed",
    EXIT_USAGE: "usage: bad flag, value or combination",
    EXIT_WORLD_SIZE: "world size the job cannot use",
    EXIT_OUTPUT: "output path not writable or refused",
    EXIT_MEMORY: "would not fit in memory",
    EXIT_DEPENDENCY: "missing optional dependency",
    EXIT_NO_DEVICE: "needs a CUDA GPU",
    EXIT_RUN_FAILED: "failed while running",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}
