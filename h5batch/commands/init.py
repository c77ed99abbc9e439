"""``h5batch init DIR``: print the job ``h5batch convert DIR`` would use, commented, to save
and edit (:mod:`h5batch.folder_job` has the rules)."""

from __future__ import annotations

NAME = "init"
HELP = "print the job a corpus folder implies, to save and edit"
DESCRIPTION = ("Look at the files under DIR and print, as a commented job file, the job that "
               "'h5batch convert DIR' would run: h5batch init DIR > job.yaml, edit, h5batch convert job.yaml.")


def add_arguments(p) -> None:
    p.add_argument("dir", help="corpus folder")
    p.add_argument("--output", help="output path written into the job (default ./<folder name>.h5)")


def run(args) -> int:
    from ..config import job_from_dict
    from ..folder_job import commented_yaml, infer

    data, notes = infer(args.dir, args.output)
    job_from_dict(data, args.dir)  # the job it prints is one convert accepts
    print(commented_yaml(data, notes), end="")
    return 0
