"""The Darknet converter: ``cfg`` reads .cfg/.weights, ``head`` builds the in-graph ``[yolo]`` decode,
``converter`` writes the ONNX file (:func:`app.models.darknet.converter.convert_darknet`)."""
