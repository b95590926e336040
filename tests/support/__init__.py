"""Test-support helpers: tiny offline seq2seq checkpoints and pytest fixtures.

Nothing here downloads weights: every model is built from a config (random init) or trained
from scratch on CPU on a synthetic task.
"""


def interruptible() -> None:
    """A Popen ``preexec_fn``: the child takes Ctrl-C as a terminal user's program does.

    A shell starts background jobs with SIGINT ignored, children inherit that, and Python then
    installs no KeyboardInterrupt handler, so the tests that send SIGINT would test nothing
    when the suite itself runs in the background."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
