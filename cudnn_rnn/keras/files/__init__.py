"""The untrusted-file boundary and the checkpoint formats: untrusted.py parses a .keras zip or an
HDF5 file with bounds on everything it reads, isolation.py runs that parse in a helper process,
containers.py turns its result into a KerasFile (config, version, weight arrays), and weights.py
finds each layer's weights in the keras3 or the legacy layout."""
