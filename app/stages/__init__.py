"""The threads between the batcher and the subscribers: engine (inference), detection and routing (detect, results),
optional result sinks (sinks, annotate), the overload report and the progress line."""
