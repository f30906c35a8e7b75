"""Model files: the Darknet converter, the default model fetch, ModelSpec reading, the name registry, INT8.

Nothing is imported or read here: importing ``app.models`` touches no file,
network or environment; see docs/models.md for the modules and their entry points.
"""
