"""``python -m ppojax.rlhf``: ``ppojax rlhf`` on a built-in task (``ppojax.rlhf.apps.task_run``)."""

from ppojax.rlhf.apps.task_run import main

if __name__ == "__main__":
    raise SystemExit(main())
