"""The model as a graph: spec.py parses Keras model configs (Keras 3, tf.keras 2.x, Keras 2) into
one form (layers, their calls, the references between them), model.py runs the rebuilt layer
modules over it with Keras's mask propagation."""
