"""Writing converted modules back as Keras 3 files (export.py: .keras, .weights.h5)."""
