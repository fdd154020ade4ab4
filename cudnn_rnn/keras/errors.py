"""The one error a Keras checkpoint that cannot be converted raises."""


class ConversionError(ValueError):
    """A Keras file that is malformed, truncated, hostile, or that this converter cannot express.

    The message names the file, the layer (when there is one) and what was expected."""

    def __init__(self, path, message: str, layer: str = None):
        self.path = str(path)
        self.layer = layer
        where = f"{self.path}" + (f", layer '{layer}'" if layer else "")
        super().__init__(f"{where}: {message}")
