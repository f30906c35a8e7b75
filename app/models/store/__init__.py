"""Where model files come from and where they live: the pinned PyPI download (``download``), the cache
folder (``cache``), atomic writes and locks (``files``), progress lines (``progress``), the default
model fetch (``fetch``), known model names (``registry``) and whether an INT8 file still matches the
fp32 file it was made from (``provenance``)."""
