import sys

from anisweep.worker import client

status = client.run(sys.argv[1:])  # None: no worker for this command (anisweep.worker)
if status is None:
    from anisweep.cli import main

    status = main()
raise SystemExit(status)
