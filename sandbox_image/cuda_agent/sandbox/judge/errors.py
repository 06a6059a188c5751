"""How a judge run ends early: the orchestrator, its references and its worker sessions raise these; the CLI
maps them to exit codes."""


class UsageError(Exception):
    """Bad arguments or unreadable files: exit 2."""


class TaskFailure(Exception):
    """The task itself failed to run: exit 2 ("task error: ...")."""


class RunStopped(Exception):
    """Judging ended early with a verdict already recorded in the result."""
