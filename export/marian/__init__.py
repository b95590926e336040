"""Marian's own model folders (Bergamot / Firefox Translations, OPUS-MT in Marian's format) as
an export family: read strictly (``weights.py``, ``config.py``), rebuilt as a torch module
(``model.py``) and exported with the shared pipeline (``export.py``). See docs/marian.md."""
