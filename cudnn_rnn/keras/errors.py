"""The one error a Keras checkpoint that cannot be converted raises."""

MAX_MESSAGE = 1000  # a message that lists a hostile file's contents stays readable


class ConversionError(ValueError):
    """A Keras file that is malformed, truncated or hostile, or that this converter cannot
    express. The message names the file, the layer (where there is one) and what was expected;
    no other exception escapes :func:`load_keras`."""

    def __init__(self, path, message: str, layer: str = None):
        self.path = str(path)
        self.layer = layer if layer is None else str(layer)[:200]
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE] + f"... ({len(message) - MAX_MESSAGE} more characters)"
        where = f"{self.path}" + (f", layer '{self.layer}'" if self.layer else "")
        super().__init__(f"{where}: {message}")


def few(names, k: int = 5) -> str:
    """The first k names and a count of the rest: error messages stay short."""
    names = list(names)
    shown = ", ".join(repr(n) if len(str(n)) < 80 else repr(str(n)[:77] + "...") for n in names[:k])
    return shown + (f" and {len(names) - k} more" if len(names) > k else "")
