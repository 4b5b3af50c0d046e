"""What can go wrong, as exceptions a caller can tell apart."""


class MeshError(Exception):
    """The node refused a request, or could not be reached."""


class ProtocolError(MeshError):
    """The node speaks another control API (or not the control protocol at all)."""


class UnknownFarm(MeshError):
    """The node knows no farm by that name or id (nor does its mesh's
    coordinator, where it asked): a typo, or a farm of another mesh."""


class FarmClosed(MeshError):
    """Stages sent to an open farm its home has closed (no client held it
    for a while: see docs/api.md's ``Hold``)."""


class FarmError(MeshError):
    """A farm the node found a mistake in; nothing of it runs.

    ``str(e)`` is what ``mesh check`` says: the file, line, column, where
    in the farm and the field, and what was expected. For a farm built in
    Python the line of the TOML it was written as follows.
    """

    def __init__(self, message, file=None, line=None, column=None, field=None, text=None):
        self.message = message
        self.file = file
        self.line = line
        self.column = column
        self.field = field
        #: The farm file's text, as sent.
        self.text = text
        shown = message
        if text is not None and line:
            lines = text.splitlines()
            if 0 < line <= len(lines):
                shown += "\n    %d | %s" % (line, lines[line - 1])
        super().__init__(shown)


class TaskFailed(MeshError):
    """A task ended for good without success (``Task.result()``)."""

    def __init__(self, task):
        self.task = task
        super().__init__("%s failed: %s" % (task.task, task.reason or "unknown reason"))


class FarmFailed(MeshError):
    """A farm ended with tasks that did not succeed (``Run.wait()``)."""

    def __init__(self, progress):
        self.progress = progress
        c = progress
        words = "%s: %d of %d done, %d failed, %d skipped, %d cancelled" % (
            progress.id,
            c.done,
            c.total,
            c.failed,
            c.skipped,
            c.cancelled,
        )
        if c.stopped:
            words += ", %d stopped" % c.stopped
        for f in progress.failures[:5]:
            words += "\n  failed: %s" % f
        for s in progress.stopped_words:
            words += "\n  %s" % s
        super().__init__(words)
