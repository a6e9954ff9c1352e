"""Run a pipeline config on a SLURM cluster through dask-jobqueue.

    pip install dask-jobqueue -c deploy/requirements.txt   # not among pipeline's extras
    python deploy/slurm/run_slurm.py configs/orderbook.yaml --jobs 8

Each SLURM job hosts one dask worker; the raw files and the store must be on a file
system every node mounts (or s3://). The same config runs unchanged: only the
scheduler address comes from here.
"""

from __future__ import annotations

import argparse
import subprocess
import sys


#: What each worker's job script exports before ``dask worker`` starts: glibc's allocator
#: settings and pyarrow's pool of a LocalCluster's workers (pipeline.cluster.WORKER_MALLOC;
#: glibc reads them when the process starts), and the sampling profiler off, as in the
#: Dockerfile and docs/pages/recipes/remote-cluster.md.
PROFILE_OFF = {"DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False"}


def worker_prologue() -> list[str]:
    """The ``export`` lines of every worker's job script."""
    from pipeline.cluster import WORKER_MALLOC

    return [f"export {k}={v}" for k, v in {**WORKER_MALLOC, **PROFILE_OFF}.items()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--jobs", type=int, default=4, help="SLURM jobs, one worker each")
    parser.add_argument("--cores", type=int, default=8)
    parser.add_argument("--memory", default="32GiB")
    parser.add_argument("--walltime", default="04:00:00")
    parser.add_argument("--queue", default=None)
    args = parser.parse_args()
    try:  # after argparse, so that --help works without it
        from dask_jobqueue import SLURMCluster
    except ImportError:
        print("run_slurm.py needs dask-jobqueue: pip install dask-jobqueue -c deploy/requirements.txt",
              file=sys.stderr)
        return 2

    cluster = SLURMCluster(
        cores=args.cores,
        processes=1,
        memory=args.memory,
        walltime=args.walltime,
        queue=args.queue,
        local_directory="$TMPDIR",  # spill to node-local disk, not the shared file system
        job_script_prologue=worker_prologue(),
    )
    cluster.scale(jobs=args.jobs)
    try:
        print(f"dashboard: {cluster.dashboard_link}", flush=True)
        return subprocess.call(["pipeline", "run", "--scheduler", cluster.scheduler_address, args.config])
    finally:
        cluster.close()


if __name__ == "__main__":
    sys.exit(main())
