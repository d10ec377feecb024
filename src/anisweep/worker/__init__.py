"""A warm worker for the commands a local Snakemake run starts: torch, transformers and the package imported once,
each command run in a fresh fork of it.

A rule's command stays `python -m anisweep COMMAND ...`. Where the run that started it asked for a worker (the
environment variable ANISWEEP_WORKER holds the pid of that Snakemake process, set by workflow/rules/common.smk
for a local run only), `anisweep.worker.client` hands its arguments, working directory, environment and standard
streams to the worker's socket instead of importing anything; the worker forks, the child runs the command as
the process would have run it, and the client exits with the child's status (or dies of its signal). A job keeps
its own process, log, exit status and isolation; it no longer pays seconds of imports.

The worker (`anisweep.worker.server`) starts on the first command of a run, listens on a socket in a folder only
its user can open (and checks each peer's uid), serves the one Snakemake process whose pid it was started for,
and exits when that process has gone and its last job has finished (or after IDLE_SECONDS without a job). It forks
no job once the package's files have changed since it started (anisweep.worker.freshness): that command runs in its
own process and the next starts a new worker. A job dies with its worker. Where no run asked for one (a command by
hand, a SLURM job on its node), or anything about the worker fails before the command starts, the command runs in
its own process as before.
"""
