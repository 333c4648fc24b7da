"""Using a trained model: load it (``capsexp.load``), predict on a person's images, explain a prediction,
export it (ONNX, TorchScript). Built on the run layer's checkpoint reader; trains nothing."""
