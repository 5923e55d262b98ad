"""kiln.capi - mirrors onnxruntime.capi for code that imports exceptions from there."""
