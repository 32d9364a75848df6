"""Start ``scopekb worker`` for the fault suite, with fault detection tuned to test time scales.

Production values are minutes (a dead worker's repository lock expires after 60 s; kombu sweeps for
unacknowledged messages past the visibility timeout about every 100 s). Here the lock expires after
``FAULTS_LOCK_TTL_S`` (default 15) seconds, the sweep runs every 2 seconds (so a redelivery after a worker
death takes the visibility timeout the test configured, not that plus a sweep period) and a dead pool process
is reported after 1 s instead of 10. Everything else is the
real worker: ``python -m tests.faults.worker_main --concurrency 1``.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Patch the two timings, then run the CLI's ``worker`` command with the given arguments."""
    import scopekb_worker.app as worker

    worker.LOCK_TTL_S = int(os.environ.get("FAULTS_LOCK_TTL_S", "15"))
    options = dict(worker.app.conf.broker_transport_options or {})
    options.update(unacked_restore_interval=2, unacked_restore_throttle=1)
    worker.app.conf.broker_transport_options = options
    worker.app.conf.worker_lost_wait = 1.0  # how long a dead pool process's result is waited for (default 10 s)

    from scopekb_cli.main import main as cli

    sys.argv = ["scopekb", "worker", *sys.argv[1:]]
    cli()


if __name__ == "__main__":
    main()
