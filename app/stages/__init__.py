"""The threads between the batcher and the subscribers: engine, results, annotation, progress."""
