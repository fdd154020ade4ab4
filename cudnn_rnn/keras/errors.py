"""The one error a Keras checkpoint that cannot be converted raises."""

MAX_MESSAGE = 1000  # a message that lists a hostile file's contents stays readable


class ConversionError(ValueError):
    """A Keras file that is malformed, truncated, hostile, or that this converter cannot express.

    The message names the file, the layer (when there is one) and what was expected."""

    def __init__(self, path, message: str, layer: str = None):
        self.path = str(path)
        self.layer = layer if layer is None else str(layer)[:200]
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE] + f"... ({len(message) - MAX_MESSAGE} more characters)"
        where = f"{self.path}" + (f", layer '{self.layer}'" if self.layer else "")
        super().__init__(f"{where}: {message}")
