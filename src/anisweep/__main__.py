import os
import sys

from anisweep.worker import client

status = client.run(sys.argv[1:])  # None: no worker for this command (anisweep.worker)
if status is None:
    from anisweep.cli import main

    status = main()
if os.environ.get("ANISWEEP_TIMINGS"):  # benchmarks/bench_workflow.py: each command's wall time
    from anisweep.worker.timing import record

    record(os.environ["ANISWEEP_TIMINGS"], sys.argv[1:], status)
raise SystemExit(status)
