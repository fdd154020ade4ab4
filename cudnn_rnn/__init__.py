from . import _C  # noqa
