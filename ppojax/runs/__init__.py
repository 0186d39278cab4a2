"""The host side of one run and of many: the runner, run folder, checkpoints, loggers, policies."""
