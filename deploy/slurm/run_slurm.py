"""Run a pipeline config on a SLURM cluster through dask-jobqueue.

    pip install dask-jobqueue -c deploy/requirements.txt
    python deploy/slurm/run_slurm.py configs/orderbook.yaml --jobs 8

Each SLURM job hosts one dask worker; the raw files and the store must be on a file
system every node mounts (or s3://). The same config runs unchanged: only the
scheduler address comes from here.
"""

from __future__ import annotations

import argparse
import subprocess
import sys


def main() -> int:
    from dask_jobqueue import SLURMCluster

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--jobs", type=int, default=4, help="SLURM jobs, one worker each")
    parser.add_argument("--cores", type=int, default=8)
    parser.add_argument("--memory", default="32GiB")
    parser.add_argument("--walltime", default="04:00:00")
    parser.add_argument("--queue", default=None)
    args = parser.parse_args()

    cluster = SLURMCluster(
        cores=args.cores,
        processes=1,
        memory=args.memory,
        walltime=args.walltime,
        queue=args.queue,
        local_directory="$TMPDIR",  # spill to node-local disk, not the shared file system
    )
    cluster.scale(jobs=args.jobs)
    try:
        print(f"dashboard: {cluster.dashboard_link}", flush=True)
        return subprocess.call(["pipeline", "run", "--scheduler", cluster.scheduler_address, args.config])
    finally:
        cluster.close()


if __name__ == "__main__":
    sys.exit(main())
