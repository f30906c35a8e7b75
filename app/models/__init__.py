"""Model files, split by job: what a model is, where it comes from, how it is made and quantized.

=====================  =====================================================================
``spec``, ``coco``     :func:`~app.models.spec.load_model_spec`: an ONNX file → ``ModelSpec``
``darknet/``           the Darknet converter: ``cfg`` (reading .cfg/.weights), ``head``
                       (the in-graph ``[yolo]`` decode), ``converter`` (``convert_darknet``)
``store/``             downloads, the cache, atomic files, progress, the registry of known
                       model names, and the provenance of INT8 files
``quantization/``      ``quantize`` (``detstream quantize``), calibration frames, and the F1
                       agreement of an INT8 model with its fp32 source
=====================  =====================================================================

Output layouts (how a model's output is decoded) live in :mod:`app.postprocess.layouts`.
Nothing is imported or read here: importing ``app.models`` touches no file,
network or environment; see docs/models.md.
"""
