"""Code that makes a child process import ``aggdec`` from another source tree: the tree named by
the environment's ``AGGDEC_TREE`` (a checkout: ``git worktree add``), with its ``runtime/`` and
``export/`` laid under ``aggdec/`` as the installed package maps them. Two versions of the code
cannot share a process (one ``aggdec`` per interpreter), so the A/B tools (``host_ab.py``,
``tokenize_cost.py``) run each side as ``python -c PREAMBLE + their own code``; the preamble
leaves the tree's root on ``sys.path`` first and names it ``top``."""

PREAMBLE = r"""
import os, sys, tempfile
tree = os.environ["AGGDEC_TREE"]
top = tempfile.mkdtemp()
pkg = os.path.join(top, "aggdec")
os.mkdir(pkg)
for name in os.listdir(os.path.join(tree, "aggdec")):
    os.symlink(os.path.join(tree, "aggdec", name), os.path.join(pkg, name))
for name in ("runtime", "export"):
    if not os.path.exists(os.path.join(pkg, name)):
        os.symlink(os.path.join(tree, name), os.path.join(pkg, name))
sys.path.insert(0, top)
"""


def check_from_tree(module_name: str) -> str:
    """Child code that fails unless ``module_name`` was imported from the tree (not the installed copy)."""
    return (f"import {module_name} as _checked\n"
            f"assert os.path.realpath(_checked.__file__).startswith(os.path.realpath(tree) + os.sep), _checked.__file__\n")
