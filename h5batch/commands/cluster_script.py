"""``h5batch cluster-script JOB``: print the batch script one worker job would be submitted
with (h5batch.conversion.cluster; needs dask-jobqueue, no batch system)."""

from __future__ import annotations

NAME = "cluster-script"
HELP = "print the batch script of one worker job (slurm, pbs, sge, lsf)"
DESCRIPTION = ("Print the job script dask-jobqueue would submit for each worker job of JOB "
               "(cluster.kind slurm, pbs, sge or lsf; resources from cluster.jobqueue). Nothing "
               "is submitted and no scheduler is started: the scheduler address is a placeholder.")


def add_arguments(p) -> None:
    p.add_argument("job", help="job file (YAML), e.g. jobs/fsdd_slurm.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a job key, e.g. --set cluster.jobqueue.queue=gpu (repeatable)")


def run(args) -> int:
    from ..config import load_job
    from ..conversion.cluster import job_script

    job = load_job(args.job, args.overrides, check_paths=False)
    print(job_script(job.cluster, job.file).rstrip("\n"))
    return 0
