"""Package data only: the cache edit graphs that ``export/edit_graphs.py`` writes and
``runtime/decoding/device_edits.py`` reads (a package, so that setuptools installs the folder
without a warning)."""
