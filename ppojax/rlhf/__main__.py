"""``python -m ppojax.rlhf``: ``ppojax rlhf`` on a built-in task (``ppojax.runs.lm.task_run``)."""

from ppojax.runs.lm.task_run import main

if __name__ == "__main__":
    raise SystemExit(main())
