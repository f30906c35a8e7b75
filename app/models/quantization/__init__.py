"""INT8 for the CPU: ``quantize`` (``detstream quantize``), the calibration frames it feeds
(``calibration``), and the F1 agreement of an INT8 model with its fp32 source (``agreement``)."""
