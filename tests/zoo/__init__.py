"""The model zoo: real architectures and training patterns recorded by NeuralDbg and checked end to end."""
